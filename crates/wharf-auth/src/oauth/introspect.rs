//! Opaque access tokens checked by introspection (RFC 7662).

use serde_json::{Map, Value};
use wharf::Grant;

use super::{Checked, audience_ok, now_secs, scopes_of};
use crate::AuthError;

#[derive(Debug)]
pub(crate) struct Introspector {
    http: reqwest::Client,
    endpoint: String,
    client_id: String,
    client_secret: crate::Secret,
}

impl Introspector {
    pub(crate) fn new(
        http: reqwest::Client,
        endpoint: String,
        client_id: String,
        client_secret: crate::Secret,
    ) -> Self {
        Introspector {
            http,
            endpoint,
            client_id,
            client_secret,
        }
    }

    pub(crate) async fn check(
        &self,
        token: &str,
        issuer: &str,
        audiences: &[String],
    ) -> Result<Checked, AuthError> {
        let res = self
            .http
            .post(&self.endpoint)
            .basic_auth(&self.client_id, Some(self.client_secret.expose()))
            .form(&[("token", token), ("token_type_hint", "access_token")])
            .send()
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "cannot reach the introspection endpoint");
                AuthError::Unavailable
            })?;
        if !res.status().is_success() {
            tracing::warn!(status = %res.status(), "the introspection endpoint refused");
            return Err(AuthError::Unavailable);
        }
        let answer: Map<String, Value> = res.json().await.map_err(|_| AuthError::Unavailable)?;
        if answer.get("active") != Some(&Value::Bool(true)) {
            return Err(AuthError::Inactive);
        }
        let text = |k: &str| answer.get(k).and_then(Value::as_str).map(str::to_owned);
        // An access token only: never a refresh token the server happens to know.
        if text("token_type").is_some_and(|t| {
            !t.eq_ignore_ascii_case("access_token") && !t.eq_ignore_ascii_case("bearer")
        }) {
            return Err(AuthError::NotAnAccessToken);
        }
        if text("iss").is_some_and(|i| i.trim_end_matches('/') != issuer.trim_end_matches('/')) {
            return Err(AuthError::WrongIssuer);
        }
        if !audience_ok(answer.get("aud"), audiences) {
            return Err(AuthError::WrongAudience);
        }
        let now = now_secs();
        let expires_at = answer
            .get("exp")
            .and_then(Value::as_u64)
            .unwrap_or(u64::MAX);
        if expires_at <= now {
            return Err(AuthError::Expired);
        }
        Ok(Checked {
            expires_at,
            grant: Grant {
                issuer: issuer.to_owned(),
                subject: text("sub").ok_or(AuthError::InvalidToken)?,
                client_id: text("client_id"),
                scopes: scopes_of(&answer),
            },
        })
    }
}
