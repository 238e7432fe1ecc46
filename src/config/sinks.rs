//! The event log's settings (SPEC 10) for the coordinator and the all-in-one: how long events
//! are kept (`--events-retention`) and the webhooks events are delivered to (`--webhook`,
//! `--webhook-filter`, `--webhook-secret-file`, `--webhook-give-up`, `--webhook-ca`).

use std::path::PathBuf;
use std::time::Duration;

use super::mask_password;
use super::ops::parse_retention;
use crate::proto::event::Type;

/// `--events-retention` and the webhooks.
#[derive(clap::Args, Clone, Debug)]
pub struct SinkArgs {
    /// How long events are kept, such as 7d or 12h; never deleted before every sink that is
    /// not paused has delivered them.
    #[arg(long, env = "HOLDFAST_EVENTS_RETENTION", default_value = "7d", value_parser = parse_period)]
    pub events_retention: Duration,

    /// An endpoint every event is POSTed to, signed, as NAME=URL (http:// or https://).
    /// Repeatable; the env var takes a comma-separated list.
    #[arg(long = "webhook", env = "HOLDFAST_WEBHOOK", value_delimiter = ',', value_parser = parse_webhook)]
    pub webhooks: Vec<(String, String)>,

    /// Only these event types go to webhook NAME, as NAME=TYPE,TYPE (the event types' names,
    /// such as RESERVATION_EXPIRED); the others are passed over. Repeatable; the env var
    /// separates webhooks with `;`.
    #[arg(long = "webhook-filter", env = "HOLDFAST_WEBHOOK_FILTER", value_delimiter = ';', value_parser = parse_filter)]
    pub webhook_filters: Vec<(String, Vec<Type>)>,

    /// The file holding the secret webhooks are signed with (HMAC-SHA256; surrounding
    /// whitespace is ignored); required with --webhook.
    #[arg(long, env = "HOLDFAST_WEBHOOK_SECRET_FILE")]
    pub webhook_secret_file: Option<PathBuf>,

    /// How long a webhook may fail without a success before it is paused (until `holdfast
    /// admin resume-webhook NAME`).
    #[arg(long, env = "HOLDFAST_WEBHOOK_GIVE_UP", default_value = "24h", value_parser = parse_period)]
    pub webhook_give_up: Duration,

    /// PEM CA file an https:// webhook's certificate must chain to, trusted alone (default:
    /// the system roots).
    #[arg(long, env = "HOLDFAST_WEBHOOK_CA")]
    pub webhook_ca: Option<PathBuf>,
}

/// A duration with unit d, h, m, s or ms (`7d`), not `off`.
fn parse_period(s: &str) -> Result<Duration, String> {
    parse_retention(s)?
        .0
        .ok_or_else(|| "give a duration such as 7d or 24h".to_owned())
}

/// Parses `NAME=URL`.
fn parse_webhook(s: &str) -> Result<(String, String), String> {
    let (name, url) = s.split_once('=').ok_or_else(|| {
        format!("{s:?} is not NAME=URL (e.g. orders=https://orders.example/holdfast)")
    })?;
    let (name, url) = (name.trim(), url.trim());
    check_name(name)?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!(
            "{s:?}: the URL must start with http:// or https://"
        ));
    }
    Ok((name.to_owned(), url.to_owned()))
}

/// A webhook's name: a metric label and a sink name, so a short word.
fn check_name(name: &str) -> Result<(), String> {
    let fine = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if fine {
        Ok(())
    } else {
        Err(format!(
            "{name:?}: a webhook's name is 1 to 64 letters, digits, '-', '_' or '.'"
        ))
    }
}

/// Parses `NAME=TYPE,TYPE` (type names as SPEC 10 spells them, any case).
fn parse_filter(s: &str) -> Result<(String, Vec<Type>), String> {
    let (name, types) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=TYPE,TYPE (e.g. orders=RESERVATION_EXPIRED)"))?;
    let name = name.trim();
    check_name(name)?;
    let mut parsed = Vec::new();
    for word in types.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let known = Type::from_str_name(&word.to_ascii_uppercase())
            .filter(|t| !matches!(t, Type::Unspecified | Type::Heartbeat));
        match known {
            Some(t) => parsed.push(t),
            None => {
                return Err(format!(
                    "{word:?} is not an event type (RESERVATION_HELD, RESERVATION_CONFIRMED, RESERVATION_EXPIRED, PAYMENT_RECORDED, REFUND_PENDING, ADMIN_ACTION, ... as SPEC 10 names them)"
                ));
            }
        }
    }
    if parsed.is_empty() {
        return Err(format!("{s:?}: name at least one event type"));
    }
    Ok((name.to_owned(), parsed))
}

impl SinkArgs {
    /// The webhooks' settings, checked: names unique, each filter naming a webhook, a secret
    /// when there is a webhook. The secret file is read here.
    pub fn webhooks(&self) -> Result<Vec<crate::sinks::webhook::WebhookSettings>, String> {
        use crate::sinks::webhook::{WebhookSecret, WebhookSettings};
        if self.webhooks.is_empty() {
            if let Some((name, _)) = self.webhook_filters.first() {
                return Err(format!(
                    "--webhook-filter {name}=...: no --webhook {name}=URL"
                ));
            }
            return Ok(Vec::new());
        }
        let path = self.webhook_secret_file.as_deref().ok_or(
            "--webhook needs --webhook-secret-file (the HMAC secret receivers verify the signature with)",
        )?;
        let secret = WebhookSecret::read(path).map_err(|e| e.to_string())?;
        for (i, (name, _)) in self.webhooks.iter().enumerate() {
            if self.webhooks[..i]
                .iter()
                .any(|(earlier, _)| earlier == name)
            {
                return Err(format!("--webhook {name}: given twice"));
            }
        }
        for (name, _) in &self.webhook_filters {
            if !self.webhooks.iter().any(|(hook, _)| hook == name) {
                return Err(format!(
                    "--webhook-filter {name}=...: no --webhook {name}=URL"
                ));
            }
        }
        Ok(self
            .webhooks
            .iter()
            .map(|(name, url)| WebhookSettings {
                name: name.clone(),
                url: url.clone(),
                types: self.filter_of(name),
                secret: secret.clone(),
                give_up: self.webhook_give_up,
                ca: self.webhook_ca.clone(),
            })
            .collect())
    }

    /// The types webhook `name` takes: every filter given for it, together.
    fn filter_of(&self, name: &str) -> Option<Vec<Type>> {
        let types: Vec<Type> = self
            .webhook_filters
            .iter()
            .filter(|(hook, _)| hook == name)
            .flat_map(|(_, types)| types.iter().copied())
            .collect();
        (!types.is_empty()).then_some(types)
    }

    /// The settings as TOML lines for `--print-config` (URLs with passwords masked, the
    /// secret file's path, never its content).
    pub fn describe(&self, out: &mut String) {
        out.push_str(&format!(
            "events_retention = \"{}\"\n",
            super::format_period(self.events_retention)
        ));
        let hooks: Vec<String> = self
            .webhooks
            .iter()
            .map(|(name, url)| format!("{:?}", format!("{name}={}", mask_password(url))))
            .collect();
        out.push_str(&format!("webhooks = [{}]\n", hooks.join(", ")));
        let filters: Vec<String> = self
            .webhook_filters
            .iter()
            .map(|(name, types)| {
                let names: Vec<&str> = types.iter().map(|t| t.as_str_name()).collect();
                format!("{:?}", format!("{name}={}", names.join(",")))
            })
            .collect();
        out.push_str(&format!("webhook_filters = [{}]\n", filters.join(", ")));
        if let Some(path) = &self.webhook_secret_file {
            out.push_str(&format!(
                "webhook_secret_file = {:?}\n",
                path.display().to_string()
            ));
        }
        out.push_str(&format!(
            "webhook_give_up = \"{}\"\n",
            super::format_period(self.webhook_give_up)
        ));
        if let Some(path) = &self.webhook_ca {
            out.push_str(&format!("webhook_ca = {:?}\n", path.display().to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhooks_and_filters_parse_or_explain() {
        assert_eq!(
            parse_webhook("orders=https://o.example/h").unwrap(),
            ("orders".into(), "https://o.example/h".into())
        );
        for bad in ["orders", "=http://x/", "orders=ftp://x/", "a b=http://x/"] {
            assert!(parse_webhook(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_filter("orders=reservation_expired, RESERVATION_CONFIRMED").unwrap(),
            (
                "orders".into(),
                vec![Type::ReservationExpired, Type::ReservationConfirmed]
            )
        );
        for bad in ["orders", "orders=", "orders=HEARTBEAT", "orders=EXPIRED"] {
            assert!(parse_filter(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_period("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_period("off").is_err());
    }

    #[test]
    fn webhooks_need_a_secret_that_is_not_empty_and_filters_a_webhook() {
        let dir = std::env::temp_dir().join(format!("holdfast-sinks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (empty, secret) = (dir.join("empty"), dir.join("secret"));
        std::fs::write(&empty, " \n").unwrap();
        std::fs::write(&secret, "s3cret\n").unwrap();
        let mut args = SinkArgs {
            events_retention: Duration::from_secs(7 * 86_400),
            webhooks: vec![("orders".into(), "http://127.0.0.1:9/h".into())],
            webhook_filters: vec![("orders".into(), vec![Type::ReservationExpired])],
            webhook_secret_file: None,
            webhook_give_up: Duration::from_secs(86_400),
            webhook_ca: None,
        };
        assert!(
            args.webhooks()
                .unwrap_err()
                .contains("--webhook-secret-file")
        );
        args.webhook_secret_file = Some(empty);
        assert!(args.webhooks().unwrap_err().contains("empty"));
        args.webhook_secret_file = Some(secret.clone());
        let hooks = args.webhooks().unwrap();
        assert_eq!(hooks[0].types, Some(vec![Type::ReservationExpired]));
        let mut described = String::new();
        args.describe(&mut described);
        assert!(
            described.contains("secret") && !described.contains("s3cret"),
            "{described}"
        );
        args.webhook_filters = vec![("billing".into(), vec![Type::AdminAction])];
        assert!(
            args.webhooks()
                .unwrap_err()
                .contains("no --webhook billing")
        );
        args.webhooks
            .push(("orders".into(), "http://127.0.0.1:9/other".into()));
        args.webhook_filters.clear();
        assert!(args.webhooks().unwrap_err().contains("given twice"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
