//! Who an HTTP request acts for. The endpoint asks an [`Authenticate`] before it reads the
//! body; `wharf-auth`'s [`Auth`](wharf_auth::Auth) (anonymous, API keys, OAuth resource
//! server) is one, [`FromExtensions`] trusts the principal an app's own middleware (cookies,
//! mTLS, a session) put in the request's extensions.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http::StatusCode;
use axum::http::request::Parts;
use serde_json::Value;
use wharf::Principal;
use wharf_auth::{Auth, AuthError};

/// What [`Authenticate::authenticate`] returns: an answer at once (no allocation), or one
/// still to come.
pub struct AuthFuture<'a>(Answer<'a>);

enum Answer<'a> {
    Ready(Option<Result<Principal, Refusal>>),
    Pending(Pin<Box<dyn Future<Output = Result<Principal, Refusal>> + Send + 'a>>),
}

impl<'a> AuthFuture<'a> {
    /// An answer known now.
    pub fn ready(answer: Result<Principal, Refusal>) -> Self {
        AuthFuture(Answer::Ready(Some(answer)))
    }

    /// An answer that needs I/O first.
    pub fn pending(answer: impl Future<Output = Result<Principal, Refusal>> + Send + 'a) -> Self {
        AuthFuture(Answer::Pending(Box::pin(answer)))
    }
}

impl Future for AuthFuture<'_> {
    type Output = Result<Principal, Refusal>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            Answer::Ready(answer) => Poll::Ready(answer.take().unwrap_or_else(|| {
                Err(Refusal::unauthorized(
                    "Unauthorized: polled after it answered",
                    None,
                ))
            })),
            Answer::Pending(answer) => answer.as_mut().poll(cx),
        }
    }
}

/// Resolves the principal of a request from its head (headers, extensions, URI).
pub trait Authenticate: Send + Sync + 'static {
    /// The principal `parts` authenticate, or the refusal to answer with.
    fn authenticate<'a>(&'a self, parts: &'a Parts) -> AuthFuture<'a>;

    /// The `WWW-Authenticate` value of a 403 answered to a request whose principal lacks
    /// `required` scopes; none by default.
    fn forbidden_challenge(&self, required: &[String]) -> Option<String> {
        let _ = required;
        None
    }

    /// Documents to serve beside the endpoint, by path (an OAuth resource server's RFC 9728
    /// metadata); none by default.
    fn documents(&self) -> Vec<(String, Value)> {
        Vec::new()
    }
}

/// Why a request was not authenticated, as the HTTP answer says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) challenge: Option<String>,
}

impl Refusal {
    /// 401: no credentials this server accepts; `challenge` goes to `WWW-Authenticate`.
    pub fn unauthorized(message: impl Into<String>, challenge: Option<String>) -> Self {
        Refusal {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
            challenge,
        }
    }

    /// 400: a malformed authorization request (RFC 6750 §3.1 `invalid_request`: a bearer
    /// header without exactly one token, a token in the URL); `challenge` goes to
    /// `WWW-Authenticate`.
    pub fn bad_request(message: impl Into<String>, challenge: Option<String>) -> Self {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            challenge,
        }
    }

    /// 403: credentials that do not allow this request.
    pub fn forbidden(message: impl Into<String>, challenge: Option<String>) -> Self {
        Refusal {
            status: StatusCode::FORBIDDEN,
            message: message.into(),
            challenge,
        }
    }

    /// 503 with `Retry-After`: the credentials could not be checked right now.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Refusal {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            challenge: None,
        }
    }
}

impl Authenticate for Auth {
    fn authenticate<'a>(&'a self, parts: &'a Parts) -> AuthFuture<'a> {
        let refusal = move |e: AuthError| {
            let challenge = Some(self.challenge(&e));
            match e {
                AuthError::InsufficientScope(_) => Refusal::forbidden(e.to_string(), challenge),
                AuthError::Malformed | AuthError::TokenInQuery => {
                    Refusal::bad_request(e.to_string(), challenge)
                }
                AuthError::Unavailable => Refusal::unavailable(e.to_string()),
                _ => Refusal::unauthorized(e.to_string(), challenge),
            }
        };
        // A token in the URL is refused whatever the mode: it would end up in logs.
        if wharf_auth::token_in_query(parts.uri.query()) {
            return AuthFuture::ready(Err(refusal(AuthError::TokenInQuery)));
        }
        match self.authenticate_now(&parts.headers) {
            Some(answer) => AuthFuture::ready(answer.map_err(refusal)),
            None => AuthFuture::pending(async move {
                Auth::authenticate(self, &parts.headers)
                    .await
                    .map_err(refusal)
            }),
        }
    }

    fn forbidden_challenge(&self, required: &[String]) -> Option<String> {
        Some(Auth::forbidden_challenge(self, required))
    }

    fn documents(&self) -> Vec<(String, Value)> {
        let Some(rs) = self.resource_server() else {
            return Vec::new();
        };
        let doc = rs.metadata().clone();
        // RFC 9728: at the well-known path, and at its form suffixed with the endpoint's path.
        std::iter::once("/.well-known/oauth-protected-resource".to_owned())
            .chain(rs.metadata_path_for_resource())
            .map(|path| (path, doc.clone()))
            .collect()
    }
}

/// Trusts the [`Principal`] an outer layer put in the request's extensions (the app's own
/// authentication: cookies, mTLS, a session); refuses a request that carries none (401).
///
/// RFC 9110 §11.6.1 wants a `WWW-Authenticate` challenge on every 401; only the app knows
/// its scheme, so it names it with [`FromExtensions::challenge`]:
///
/// ```
/// use axum::http::HeaderValue;
/// use wharf_http::FromExtensions;
///
/// let auth = FromExtensions::new().challenge(HeaderValue::from_static(r#"Cookie realm="app""#));
/// # let _ = auth;
/// ```
#[derive(Debug, Clone, Default)]
pub struct FromExtensions {
    challenge: Option<String>,
}

impl FromExtensions {
    /// Refuses a request without a principal with a bare 401 until a challenge is given.
    pub fn new() -> Self {
        Self::default()
    }

    /// The `WWW-Authenticate` value of the 401 answered to a request without a principal.
    /// A value that is not visible ASCII (which `to_str` refuses) is left out.
    #[must_use]
    pub fn challenge(mut self, value: axum::http::HeaderValue) -> Self {
        self.challenge = value.to_str().ok().map(str::to_owned);
        self
    }
}

impl Authenticate for FromExtensions {
    fn authenticate<'a>(&'a self, parts: &'a Parts) -> AuthFuture<'a> {
        AuthFuture::ready(parts.extensions.get::<Principal>().cloned().ok_or_else(|| {
            Refusal::unauthorized(
                "Unauthorized: the request was not authenticated",
                self.challenge.clone(),
            )
        }))
    }
}
