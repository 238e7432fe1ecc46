//! Webhooks (SPEC 10): signed POSTs of each event to an operator's endpoint.
