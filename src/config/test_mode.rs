//! `--test-mode` (SPEC 9, the all-in-one only): serve `tcc.v1.Testing` and run on a movable
//! clock, for tests written in any language. Time control is for a test's own machine, so
//! every listener must be on loopback.

use std::net::SocketAddr;

/// Whether the all-in-one runs in test mode.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TestModeArgs {
    /// Test mode (all-in-one only, loopback only): adds tcc.v1.Testing (AdvanceClock,
    /// ExpireNow) and runs every database on a clock that AdvanceClock moves forward.
    #[arg(long, env = "HOLDFAST_TEST_MODE")]
    pub test_mode: bool,
}

impl TestModeArgs {
    /// Refuses test mode on a listener that is not loopback, naming its flag: `listen` is
    /// `--listen`'s address, `http` `--http-listen`'s (if on).
    pub fn check(&self, listen: SocketAddr, http: Option<SocketAddr>) -> Result<(), String> {
        if !self.test_mode {
            return Ok(());
        }
        let flags = std::iter::once(("--listen", listen)).chain(http.map(|a| ("--http-listen", a)));
        for (flag, addr) in flags {
            if !addr.ip().is_loopback() {
                return Err(format!(
                    "--test-mode refuses {flag} {addr}: anyone who reaches it could move the clock and expire holds; listen on a loopback address (127.0.0.1 or ::1)"
                ));
            }
        }
        Ok(())
    }

    /// The setting as a TOML line for `--print-config`.
    pub fn describe(&self, out: &mut String) {
        out.push_str(&format!("test_mode = {}\n", self.test_mode));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_mode_listens_on_loopback_only() {
        let on = TestModeArgs { test_mode: true };
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let open: SocketAddr = "0.0.0.0:1".parse().unwrap();
        assert!(on.check(local, Some("[::1]:2".parse().unwrap())).is_ok());
        assert!(
            on.check(open, None)
                .unwrap_err()
                .contains("--listen 0.0.0.0:1")
        );
        assert!(
            on.check(local, Some(open))
                .unwrap_err()
                .contains("--http-listen")
        );
        assert!(TestModeArgs::default().check(open, Some(open)).is_ok());
    }
}
