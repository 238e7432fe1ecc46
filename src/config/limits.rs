//! The coordinator's input limits and overload limits, as its settings give them (checked,
//! each error naming the flag).

use super::CoordinatorArgs;
use crate::domain::validate::Limits;

impl CoordinatorArgs {
    /// Input limits, with this configuration's ttl bounds.
    pub fn limits(&self) -> Result<Limits, String> {
        let limits = Limits {
            default_ttl: self.default_ttl,
            max_ttl: self.max_ttl,
            max_queue_wait: self.waitlist.max_queue_wait,
            ..Limits::default()
        };
        if limits.max_ttl < limits.min_ttl {
            return Err(format!("--max-ttl must be at least {:?}", limits.min_ttl));
        }
        if limits.max_ttl > crate::domain::validate::TTL_CEILING {
            return Err("--max-ttl must be at most 100 years".into());
        }
        if limits.default_ttl < limits.min_ttl || limits.default_ttl > limits.max_ttl {
            return Err("--default-ttl must be between 1s and --max-ttl".into());
        }
        Ok(limits)
    }

    /// The server's overload limits.
    pub(crate) fn server_limits(&self) -> crate::server::ServerLimits {
        crate::server::ServerLimits {
            max_concurrent_requests: self.max_concurrent_requests,
            request_timeout: self.request_timeout,
        }
    }
}
