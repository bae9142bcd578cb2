//! The error answers that many endpoints give alike, each described once
//! for the OpenAPI document: an endpoint lists them by type in
//! `#[utoipa::path(responses(...))]`, next to the answers of its own.
//!
//! Owns: the wording of the shared error answers in the document. Must
//! never: build an answer (`ApiError` does; these types only describe
//! what it sends, and no handler returns one).

#![allow(dead_code, reason = "described in the OpenAPI document, never built")]

use std::collections::BTreeMap;

use utoipa::openapi::{RefOr, Response};
use utoipa::IntoResponses;

use crate::ErrorBody;

/// 401 to any request but the health checks and this document.
#[derive(IntoResponses)]
#[response(
    status = 401,
    description = "No bearer token, or one the gateway does not know"
)]
pub(crate) struct Unauthorized(ErrorBody);

/// 403 to an admin request: a tenant's token.
#[derive(IntoResponses)]
#[response(status = 403, description = "Not the admin token")]
pub(crate) struct NotAdmin(ErrorBody);

/// 403 to a submission: a tenant's token submitting for another tenant.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "A tenant token submitting for another tenant"
)]
pub(crate) struct OtherTenant(ErrorBody);

/// 429 to a write other than a submission.
#[derive(IntoResponses)]
#[response(
    status = 429,
    description = "Too many writes in flight; retry after the Retry-After seconds"
)]
pub(crate) struct WritesBusy(ErrorBody);

/// 429 to a submission.
#[derive(IntoResponses)]
#[response(
    status = 429,
    description = "Too many submissions in flight; retry after the Retry-After seconds"
)]
pub(crate) struct SubmissionsBusy(ErrorBody);

/// 503 to a write: the log did not take it.
#[derive(IntoResponses)]
#[response(
    status = 503,
    description = "The log is unavailable; nothing was written"
)]
pub(crate) struct NothingWritten(ErrorBody);

/// 413: a JSON body over its limit.
#[derive(IntoResponses)]
#[response(status = 413, description = "The body is over 256 KiB")]
pub(crate) struct TooLarge(ErrorBody);

/// 415: a body that is not JSON.
#[derive(IntoResponses)]
#[response(
    status = 415,
    description = "The body is not `Content-Type: application/json`"
)]
pub(crate) struct NotJson(ErrorBody);

/// 400 to a request for one job: the id in the path is not a job number.
#[derive(IntoResponses)]
#[response(status = 400, description = "`id` is not a job number")]
pub(crate) struct NotAJobId(ErrorBody);

/// 404 to a request for one job.
#[derive(IntoResponses)]
#[response(status = 404, description = "No such job, or another tenant's")]
pub(crate) struct NoSuchJob(ErrorBody);

/// 400 to a request whose body or path broke a rule of its schema.
#[derive(IntoResponses)]
#[response(status = 400, description = "A field broke a rule (named in `field`)")]
pub(crate) struct FieldBroken(ErrorBody);

/// 404 to a request for one node.
#[derive(IntoResponses)]
#[response(status = 404, description = "No such node")]
pub(crate) struct NoSuchNode(ErrorBody);

/// 409 to a change of a tenant's settings the scheduler refused.
#[derive(IntoResponses)]
#[response(
    status = 409,
    description = "The scheduler refused the configuration; the tenant is unchanged"
)]
pub(crate) struct ConfigRefused(ErrorBody);

/// 503 to a read of the log.
#[derive(IntoResponses)]
#[response(status = 503, description = "The log is unavailable")]
pub(crate) struct LogUnavailable(ErrorBody);

/// What any admin write may answer besides its own: 401, 403 to a
/// tenant's token, 429 and 503 ([`Unauthorized`], [`NotAdmin`],
/// [`WritesBusy`], [`NothingWritten`]).
pub(crate) struct AdminWrite;

impl IntoResponses for AdminWrite {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let mut all = Unauthorized::responses();
        all.extend(NotAdmin::responses());
        all.extend(WritesBusy::responses());
        all.extend(NothingWritten::responses());
        all
    }
}
