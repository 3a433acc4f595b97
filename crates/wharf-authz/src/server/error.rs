//! OAuth errors as the token and registration endpoints send them (RFC 6749 §5.2, RFC 7591
//! §3.2.2): a status, an `error` code and a description that names the problem.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered as JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {description}")]
pub struct OAuthError {
    status: StatusCode,
    code: &'static str,
    description: String,
}

impl OAuthError {
    /// An error with its status and RFC code.
    pub(crate) fn new(
        status: StatusCode,
        code: &'static str,
        description: impl Into<String>,
    ) -> Self {
        Self {
            status,
            code,
            description: description.into(),
        }
    }

    /// Whether it asks the client to retry (the failure was for now).
    pub(crate) fn is_temporary(&self) -> bool {
        self.code == "temporarily_unavailable"
    }

    pub(crate) fn invalid_request(description: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", description)
    }

    pub(crate) fn invalid_grant(description: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_grant", description)
    }

    pub(crate) fn invalid_client(description: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_client", description)
    }

    pub(crate) fn server_error(detail: impl std::fmt::Display) -> Self {
        tracing::error!(%detail, "authorization server error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "the authorization server failed; try again",
        )
    }

    /// Something this server needs elsewhere did not answer for now (a client's metadata
    /// document host timed out, refused the connection or failed with a 5xx): 503 with
    /// `Retry-After`. RFC 6749 names `temporarily_unavailable` for this at the authorization
    /// endpoint; at the token endpoint it tells the client to retry, where `invalid_client`
    /// would make it drop its credentials.
    pub(crate) fn temporarily_unavailable(description: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            description,
        )
    }

    /// Over a rate limit: 429 with `Retry-After`. OAuth defines no code for it outside the
    /// device flow, so the code is the generic one and the description says why.
    pub(crate) fn too_many(what: &str) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "invalid_request",
            format!("too many {what} from this address; wait a minute"),
        )
    }

    /// The RFC error code.
    pub fn code(&self) -> &'static str {
        self.code
    }
}

impl IntoResponse for OAuthError {
    fn into_response(self) -> Response {
        let body = json!({ "error": self.code, "error_description": self.description });
        let mut response = (self.status, Json(body)).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(super::clients::RETRY_AFTER_SECS),
            );
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"token\""),
            );
        }
        response
    }
}
