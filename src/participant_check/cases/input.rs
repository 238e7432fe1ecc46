//! Deadlines and bad input: a Try whose `expires_at` has passed (either refused, holding
//! nothing, or held and kept until `expires_at + orphan_grace` - SPEC 3.3 lets no
//! participant release a granted hold before that), one beyond any `--max-hold` (SPEC 7.3:
//! `INVALID_ARGUMENT`), malformed Trys (`INVALID_ARGUMENT` naming the field, nothing held),
//! and bytes that are no protobuf at all (an error status, and the participant still serves).

use http::uri::PathAndQuery;
use prost::bytes::{Buf, BufMut};
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use super::{Ctx, Step, describe_try};
use crate::participant_check::subject::{code_name, describe_status, from_now};
use crate::proto::TryRequest;
use crate::proto::branch::State;
use crate::proto::try_response::Outcome;

/// How far in the past the expired Try's deadline lies: well inside any orphan grace.
const EXPIRED_BY_SECONDS: i64 = 5;
/// How far ahead the too-far Try's deadline lies: beyond any sensible `--max-hold`.
const TOO_FAR_DAYS: i64 = 3650;

/// A Try expiring 5 s ago: REJECTED or INVALID_ARGUMENT with nothing held, or HELD and then
/// confirmable (the hold is kept until `expires_at + orphan_grace`).
pub(crate) async fn expires_at_past(c: &mut Ctx<'_>) -> Step {
    let q = c.quantity();
    let mut b = c.branch();
    b.expires_at = Some(from_now(chrono::Duration::seconds(-EXPIRED_BY_SECONDS)));
    let got = c.try_(&b).await;
    let seen = describe_try(&got);
    match &got {
        Ok(t) if t.outcome == Outcome::Held as i32 => {
            c.saw(format!("Try {seen}"));
            let got = c.confirm(&b).await;
            c.expect_state(
                "Confirm (kept until expires_at + orphan_grace)",
                got,
                State::Confirmed,
            )?;
            c.expect_counts("after", 0, q).await
        }
        Ok(t) if t.outcome == Outcome::Rejected as i32 => {
            c.saw(format!("Try {seen}"));
            c.expect_counts("after", 0, 0).await
        }
        Err(s) if s.code() == Code::InvalidArgument => {
            c.saw(format!("Try {seen}"));
            c.expect_counts("after", 0, 0).await
        }
        _ => c.wrong(format!(
            "Try {seen} (expected HELD, REJECTED or INVALID_ARGUMENT)"
        )),
    }
}

/// A Try expiring in ten years: INVALID_ARGUMENT naming `expires_at`, nothing held.
pub(crate) async fn expires_at_too_far(c: &mut Ctx<'_>) -> Step {
    let mut b = c.branch();
    b.expires_at = Some(from_now(chrono::Duration::days(TOO_FAR_DAYS)));
    expect_invalid(c, "Try", &b, "expires_at").await?;
    c.expect_counts("after", 0, 0).await
}

/// Malformed Trys, each INVALID_ARGUMENT naming its field; nothing held.
pub async fn invalid_try(c: &mut Ctx<'_>) -> Step {
    let base = c.branch();
    let mut cases: Vec<(&str, &str, TryRequest)> = Vec::new();
    let mut r = base.clone();
    r.reservation_id.clear();
    cases.push(("no reservation_id", "reservation_id", r));
    let mut r = c.branch();
    r.branch_id.clear();
    cases.push(("no branch_id", "branch_id", r));
    let mut r = c.branch();
    r.items.clear();
    cases.push(("no items", "items", r));
    let mut r = c.branch();
    r.items[0].quantity = 0;
    cases.push(("quantity 0", "quantity", r));
    let mut r = c.branch();
    r.items[0].resource.clear();
    cases.push(("no resource", "resource", r));
    let mut r = c.branch();
    r.expires_at = None;
    cases.push(("no expires_at", "expires_at", r));
    for (step, field, r) in &cases {
        expect_invalid(c, step, r, field).await?;
    }
    c.expect_counts("after", 0, 0).await
}

/// `step` must answer INVALID_ARGUMENT with a message naming `field`.
async fn expect_invalid(c: &mut Ctx<'_>, step: &str, r: &TryRequest, field: &str) -> Step {
    let got = c.try_(r).await;
    let seen = describe_try(&got);
    match &got {
        Err(s) if s.code() == Code::InvalidArgument && s.message().contains(field) => {
            c.saw(format!("{step}: INVALID_ARGUMENT"));
            Ok(())
        }
        _ => c.wrong(format!(
            "{step}: {seen} (expected INVALID_ARGUMENT naming {field})"
        )),
    }
}

/// Bytes that are no protobuf, to Try and to Confirm: each an error status (not OK, not a
/// dropped call); then a Cancel of a fresh branch still answers CANCELLED.
pub(crate) async fn garbage_bytes(c: &mut Ctx<'_>) -> Step {
    let channel = match c.subject.args.target.channel() {
        Ok(ch) => ch,
        Err(e) => return c.wrong(format!("a connection: {e}")),
    };
    for (method, path) in [
        ("Try", "/tcc.v1.Participant/Try"),
        ("Confirm", "/tcc.v1.Participant/Confirm"),
    ] {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        if let Err(e) = grpc.ready().await {
            return c.wrong(format!("{method}: not ready: {e}"));
        }
        let got = grpc
            .unary(
                tonic::Request::new(vec![0xff; 24]),
                PathAndQuery::from_static(path),
                RawCodec,
            )
            .await;
        match got {
            Ok(_) => {
                return c.wrong(format!(
                    "{method} of garbage: OK (expected an error status)"
                ));
            }
            Err(s) if crate::participant_check::subject::is_transport(&s) => {
                return c.wrong(format!(
                    "{method} of garbage: {} (expected an error status from the participant)",
                    describe_status(&s)
                ));
            }
            Err(s) => c.saw(format!("{method} of garbage: {}", code_name(s.code()))),
        }
    }
    let b = c.branch();
    let got = c.cancel(&b).await;
    c.expect_state("then a Cancel", got, State::Cancelled)
}

/// Sends bytes as they are and answers them as they came: no protobuf on either side.
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n).to_vec()))
    }
}
