//! [`Watch`]: a reservation's states as a [`futures_core::Stream`].

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;

use crate::{Error, Reservation, proto};

/// The states of one reservation as they change, ending after a terminal one.
#[derive(Debug)]
pub struct Watch {
    inner: tonic::Streaming<proto::Reservation>,
}

impl Watch {
    pub(crate) fn new(inner: tonic::Streaming<proto::Reservation>) -> Watch {
        Watch { inner }
    }

    /// The next state, or `None` when the stream ended.
    pub async fn next(&mut self) -> Option<Result<Reservation, Error>> {
        match self.inner.message().await {
            Ok(Some(r)) => Some(Reservation::from_proto(r)),
            Ok(None) => None,
            Err(status) => Some(Err(Error::from_status(&status))),
        }
    }
}

impl Stream for Watch {
    type Item = Result<Reservation, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner).poll_next(cx).map(|item| {
            item.map(|r| match r {
                Ok(r) => Reservation::from_proto(r),
                Err(status) => Err(Error::from_status(&status)),
            })
        })
    }
}
