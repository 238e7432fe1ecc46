//! The participant under check as the cases see it: its clients, and what the run may rely
//! on - whether it creates resources (`ResourceAdmin/PutResources`), whether its
//! `GetResource` counts can be read per resource, and the capacity the capacity cases assume.
//! Found out once at the start ([`Subject::connect`]), which also tells an unreachable
//! participant (exit 3) from a refusing one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tonic::{Code, Status};

use super::target::CheckChannel;
use super::{CheckArgs, CheckError};
use crate::proto::participant_client::ParticipantClient;
use crate::proto::resource_admin_client::ResourceAdminClient;
use crate::proto::{
    GetResourceRequest, Hold, Interval, PutResourcesRequest, ResourceSpec, ResourceStatus,
};

/// Longest resource id (SPEC: 1..128 bytes); the suffix of a per-case resource needs room.
const MAX_RESOURCE_BYTES: usize = 128;
const CASE_SUFFIX_BYTES: usize = 16;

/// Units a resource held and confirmed, as `GetResource` counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub held: i64,
    pub confirmed: i64,
}

/// The participant and what this run knows about it.
pub struct Subject {
    pub args: CheckArgs,
    participant: ParticipantClient<CheckChannel>,
    admin: ResourceAdminClient<CheckChannel>,
    /// Whether PutResources creates resources: then every case gets a fresh one.
    creates_resources: bool,
    /// Why `GetResource` counts are not checked, if they are not.
    pub counts_unusable: Option<String>,
    /// Why the capacity cases are skipped, if they are.
    pub capacity_unknown: Option<String>,
    /// Unique to this run, so a run can be repeated against the same participant.
    run_id: String,
    cases_started: AtomicUsize,
    /// Slots of `--slot` are laid out from here.
    pub started: DateTime<Utc>,
    /// What the run found out, for the report.
    pub notes: Vec<String>,
}

impl Subject {
    /// Connects and finds out what the participant offers; `Unreachable` when it does not
    /// answer at all, `Usage` when it refuses the resource the flags describe.
    pub async fn connect(args: CheckArgs) -> Result<Subject, CheckError> {
        if args.resource.is_empty() || args.resource.len() > MAX_RESOURCE_BYTES - CASE_SUFFIX_BYTES
        {
            return Err(CheckError::Usage(format!(
                "--resource must be 1..={} bytes",
                MAX_RESOURCE_BYTES - CASE_SUFFIX_BYTES
            )));
        }
        if args.quantity < 1 {
            return Err(CheckError::Usage("--quantity must be >= 1".to_owned()));
        }
        if args.capacity.is_some_and(|c| c < 0) {
            return Err(CheckError::Usage("--capacity must be >= 0".to_owned()));
        }
        let channel = args.target.channel()?;
        let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
        let mut subject = Subject {
            participant: ParticipantClient::new(channel.clone()),
            admin: ResourceAdminClient::new(channel),
            creates_resources: false,
            counts_unusable: None,
            capacity_unknown: None,
            run_id,
            cases_started: AtomicUsize::new(0),
            started: Utc::now(),
            notes: Vec::new(),
            args,
        };
        subject.probe().await?;
        Ok(subject)
    }

    /// Creates a probe resource (when a capacity is given) and reads it back.
    async fn probe(&mut self) -> Result<(), CheckError> {
        let probe = match self.args.capacity {
            Some(capacity) => {
                let name = self.case_resource_name(0);
                match self.put(&name, capacity).await {
                    Ok(()) => {
                        self.creates_resources = true;
                        self.notes.push(format!(
                            "ResourceAdmin/PutResources offered: each case runs on a fresh resource {}-{}-<n> of capacity {capacity}",
                            self.args.resource, self.run_id
                        ));
                        name
                    }
                    Err(s) if s.code() == Code::Unimplemented => {
                        self.notes.push(format!(
                            "ResourceAdmin/PutResources not offered: every case runs on {:?}, assumed to have {capacity} units free; this run confirms up to {} units of it",
                            self.args.resource,
                            4 * self.args.quantity
                        ));
                        self.args.resource.clone()
                    }
                    Err(s) => return Err(self.refusal("PutResources", &s)),
                }
            }
            None => {
                self.capacity_unknown = Some("no --capacity given".to_owned());
                self.args.resource.clone()
            }
        };
        match self.get(&probe).await {
            Ok(status) => self.judge_counts(&status),
            Err(s) if s.code() == Code::Unimplemented => {
                self.counts_unusable = Some("ResourceAdmin/GetResource not offered".to_owned());
            }
            Err(s) if is_transport(&s) => return Err(self.unreachable(&s)),
            Err(s) => {
                self.counts_unusable = Some(format!(
                    "GetResource({probe:?}) answered {}",
                    describe_status(&s)
                ));
            }
        }
        if self.creates_resources && self.counts_unusable.is_some() {
            // Without counts nothing shows that the resource was made with this capacity.
            self.capacity_unknown = self.counts_unusable.clone();
        }
        if !self.creates_resources && self.args.slot.is_some() && self.counts_unusable.is_none() {
            self.counts_unusable = Some(
                "without PutResources each case holds a later slot, which counts of now do not show"
                    .to_owned(),
            );
        }
        if let Some(why) = &self.counts_unusable {
            self.notes
                .push(format!("counts not checked (answers only): {why}"));
        }
        if let Some(why) = &self.capacity_unknown {
            self.notes.push(format!("capacity cases skipped: {why}"));
        }
        Ok(())
    }

    /// Whether a probe's counts can be read as this resource's own.
    fn judge_counts(&mut self, s: &ResourceStatus) {
        let fresh = match self.args.capacity {
            Some(c) if self.creates_resources => {
                s.capacity == c && s.available == c && s.held == 0 && s.confirmed == 0
            }
            _ => s.capacity == s.available + s.held + s.confirmed,
        };
        if !fresh {
            self.counts_unusable = Some(format!(
                "GetResource of a resource just made answered capacity {} available {} held {} confirmed {}: the participant does not count this resource's capacity",
                s.capacity, s.available, s.held, s.confirmed
            ));
        }
    }

    fn case_resource_name(&self, n: usize) -> String {
        format!("{}-{}-{n}", self.args.resource, self.run_id)
    }

    /// The resource case number `n` (from 1) runs on: a fresh one of `--capacity` when the
    /// participant creates resources, else `--resource`.
    pub(crate) async fn resource_for_case(&self) -> Result<(String, usize), Status> {
        let n = self.cases_started.fetch_add(1, Ordering::Relaxed) + 1;
        match self.args.capacity {
            Some(capacity) if self.creates_resources => {
                let name = self.case_resource_name(n);
                self.put(&name, capacity).await?;
                Ok((name, n))
            }
            _ => Ok((self.args.resource.clone(), n)),
        }
    }

    /// The slot case `n`'s items hold under `--slot`: covering now on a fresh resource, else
    /// a slot of its own ahead (cases on one resource must not collide).
    pub fn slot(&self, n: usize) -> Option<Interval> {
        let length = chrono::Duration::from_std(self.args.slot?).ok()?;
        let start = if self.creates_resources {
            self.started - length / 2
        } else {
            self.started + chrono::Duration::hours(1) + length * i32::try_from(n).ok()?
        };
        Some(Interval {
            start: Some(timestamp(start)),
            end: Some(timestamp(start + length)),
        })
    }

    /// One item of `quantity` on `resource`.
    pub fn hold(&self, resource: &str, quantity: i64, slot: Option<Interval>) -> Hold {
        Hold {
            participant: String::new(),
            resource: resource.to_owned(),
            quantity,
            during: slot,
        }
    }

    /// The resource's counts, when they can be read.
    pub async fn counts(&self, resource: &str) -> Result<Option<Counts>, Status> {
        if self.counts_unusable.is_some() {
            return Ok(None);
        }
        let s = self.get(resource).await?;
        Ok(Some(Counts {
            held: s.held,
            confirmed: s.confirmed,
        }))
    }

    /// A client of `tcc.v1.Participant` on the run's connection.
    pub fn participant(&self) -> ParticipantClient<CheckChannel> {
        self.participant.clone()
    }

    async fn put(&self, resource: &str, capacity: i64) -> Result<(), Status> {
        self.admin
            .clone()
            .put_resources(PutResourcesRequest {
                resources: vec![ResourceSpec {
                    resource: resource.to_owned(),
                    capacity,
                }],
            })
            .await
            .map(|_| ())
    }

    async fn get(&self, resource: &str) -> Result<ResourceStatus, Status> {
        Ok(self
            .admin
            .clone()
            .get_resource(GetResourceRequest {
                resource: resource.to_owned(),
            })
            .await?
            .into_inner())
    }

    fn refusal(&self, what: &str, s: &Status) -> CheckError {
        if is_transport(s) {
            return self.unreachable(s);
        }
        CheckError::Usage(format!(
            "{what} of --resource {:?} --capacity {} refused: {}",
            self.args.resource,
            self.args.capacity.unwrap_or_default(),
            describe_status(s)
        ))
    }

    fn unreachable(&self, s: &Status) -> CheckError {
        CheckError::Unreachable {
            url: self.args.target.url.clone(),
            message: describe_status(s),
        }
    }
}

/// Whether a status is the transport's (no answer) rather than the participant's.
pub(crate) fn is_transport(s: &Status) -> bool {
    // A per-call timeout of the channel comes back as CANCELLED.
    matches!(
        s.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled
    )
}

/// `CODE: message`, for the report.
pub(crate) fn describe_status(s: &Status) -> String {
    let message = s.message();
    let code = code_name(s.code());
    if message.is_empty() {
        code
    } else {
        format!("{code}: {message}")
    }
}

/// A status code as the SPEC names it: `INVALID_ARGUMENT`.
pub(crate) fn code_name(code: Code) -> String {
    screaming(&format!("{code:?}"))
}

/// `InvalidArgument` -> `INVALID_ARGUMENT`.
fn screaming(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// A protobuf timestamp of `t`.
pub fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

/// A protobuf timestamp `d` from now (negative: in the past).
pub fn from_now(d: chrono::Duration) -> prost_types::Timestamp {
    timestamp(Utc::now() + d)
}

/// How long a case may take in all: several calls' deadlines, never unbounded.
pub(crate) fn case_deadline(call: Duration) -> Duration {
    (call * 8).max(Duration::from_secs(60))
}

#[cfg(test)]
mod tests {
    #[test]
    fn codes_are_named_as_the_spec_names_them() {
        assert_eq!(super::screaming("InvalidArgument"), "INVALID_ARGUMENT");
        assert_eq!(super::screaming("Ok"), "OK");
    }
}
