//! The lease must cover the longest call chain a driver makes under it (SPEC: no branch driven
//! by two instances at once): checked at start, naming the flags to change.

use std::time::Duration;

use super::CoordinatorArgs;
use crate::coordinator::Policy;
use crate::coordinator::policy::LEASED_CALL_PHASES;

/// Refuses a `--lease` shorter than [`Policy::lease_needed`] for the slowest participant
/// (`--participant-timeout`, or a config file's `participants.NAME.timeout`) and
/// `--request-timeout`.
pub(super) fn check(args: &CoordinatorArgs) -> Result<(), String> {
    let (longest, source) = args
        .endpoints()
        .into_iter()
        .filter(|e| args.participant_timeouts.contains_key(&e.name))
        .map(|e| {
            let source = format!("participants.{}.timeout in the config file", e.name);
            (e.timeout, source)
        })
        .fold(
            (args.participant_timeout, "--participant-timeout".to_owned()),
            |longest, each| if each.0 > longest.0 { each } else { longest },
        );
    let needed = Policy::lease_needed(longest, args.request_timeout);
    if args.lease >= needed {
        return Ok(());
    }
    Err(format!(
        "--lease {} does not cover the longest call chain a lease must: --request-timeout {} \
         + {LEASED_CALL_PHASES} x {} (the longest participant timeout, {source}) = {}; raise \
         --lease to at least {} or lower those",
        shown(args.lease),
        shown(args.request_timeout),
        shown(longest),
        shown(needed),
        shown(needed),
    ))
}

fn shown(d: Duration) -> String {
    format!("{d:?}")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn args(flags: &[&str]) -> CoordinatorArgs {
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: CoordinatorArgs,
        }
        let mut argv = vec!["holdfast"];
        argv.extend_from_slice(flags);
        Cli::parse_from(argv).args
    }

    #[test]
    fn the_defaults_pass() {
        assert_eq!(check(&args(&[])), Ok(()));
    }

    #[test]
    fn a_lease_shorter_than_the_call_chain_is_refused_naming_the_flags() {
        let err = check(&args(&["--lease", "30s"])).unwrap_err();
        for flag in [
            "--lease 30s",
            "--request-timeout 30s",
            "--participant-timeout",
            "= 40s",
        ] {
            assert!(err.contains(flag), "{flag:?} missing in: {err}");
        }
        let err = check(&args(&[
            "--lease",
            "10s",
            "--request-timeout",
            "1s",
            "--participant-timeout",
            "5s",
        ]))
        .unwrap_err();
        assert!(err.contains("= 11s"), "{err}");
        assert_eq!(
            check(&args(&[
                "--lease",
                "11s",
                "--request-timeout",
                "1s",
                "--participant-timeout",
                "5s"
            ])),
            Ok(())
        );
    }

    #[test]
    fn a_slower_participant_from_the_config_file_counts_and_is_named() {
        let mut a = args(&[
            "--lease",
            "60s",
            "--participant",
            "stock=http://127.0.0.1:1",
        ]);
        assert_eq!(check(&a), Ok(()));
        a.participant_timeouts
            .insert("stock".into(), Duration::from_secs(20));
        let err = check(&a).unwrap_err();
        assert!(err.contains("participants.stock.timeout"), "{err}");
        assert!(err.contains("= 70s"), "{err}");
    }
}
