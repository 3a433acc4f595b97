//! Opaque access tokens checked by introspection (RFC 7662).

use serde_json::{Map, Value};
use wharf::Grant;

use super::{Checked, audience_ok, now_secs, numeric_date, scopes_of};
use crate::AuthError;

/// Introspection requests one process has in flight at most. Tokens it has not seen each
/// cost a request to the authorization server: a flood of made-up tokens gets 503 beyond
/// this many rather than a flood of requests there (tokens already checked are cached).
pub(crate) const MAX_IN_FLIGHT: usize = 16;

/// Introspection requests one process starts per second at most, on average (bursts of
/// [`MAX_IN_FLIGHT`]): the cap on requests in flight alone lets a fast authorization
/// server be asked hundreds of times a second about made-up tokens.
pub(crate) const MAX_PER_SECOND: f64 = 50.0;

/// A token bucket: [`MAX_IN_FLIGHT`] requests at once, refilled at [`MAX_PER_SECOND`].
#[derive(Debug)]
struct Budget(std::sync::Mutex<(f64, std::time::Instant)>);

impl Budget {
    fn new(now: std::time::Instant) -> Self {
        Budget(std::sync::Mutex::new((MAX_IN_FLIGHT as f64, now)))
    }

    /// Takes one request's worth, if there is one at `now`.
    fn take(&self, now: std::time::Instant) -> bool {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (left, at) = &mut *state;
        let earned = now.saturating_duration_since(*at).as_secs_f64() * MAX_PER_SECOND;
        *left = (*left + earned).min(MAX_IN_FLIGHT as f64);
        *at = now.max(*at);
        if *left >= 1.0 {
            *left -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug)]
pub(crate) struct Introspector {
    http: reqwest::Client,
    endpoint: String,
    client_id: String,
    client_secret: crate::Secret,
    in_flight: tokio::sync::Semaphore,
    budget: Budget,
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
            in_flight: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
            budget: Budget::new(std::time::Instant::now()),
        }
    }

    pub(crate) async fn check(
        &self,
        token: &str,
        issuer: &str,
        audiences: &[String],
    ) -> Result<Checked, AuthError> {
        let Ok(_slot) = self.in_flight.try_acquire() else {
            tracing::warn!(
                limit = MAX_IN_FLIGHT,
                "introspection requests at their limit; a new token is refused for now"
            );
            return Err(AuthError::Unavailable);
        };
        if !self.budget.take(std::time::Instant::now()) {
            tracing::warn!(
                per_second = MAX_PER_SECOND,
                "introspection requests at their rate; a new token is refused for now"
            );
            return Err(AuthError::Unavailable);
        }
        let request = self.http.post(&self.endpoint);
        let res = super::client_basic_auth(request, &self.client_id, self.client_secret.expose())
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
        // A token bound to a key or certificate (RFC 9449 §6.2, RFC 8705 §3.2): its binding
        // cannot be checked here, and a bearer use of it must not succeed.
        if answer.contains_key("cnf") {
            return Err(AuthError::SenderConstrained);
        }
        let now = now_secs();
        // No `exp` is no expiry the answer states (RFC 7662 makes it optional).
        let expires_at = match answer.get("exp") {
            None => u64::MAX,
            Some(exp) => numeric_date(exp).ok_or(AuthError::InvalidToken)?,
        };
        if expires_at <= now {
            return Err(AuthError::Expired);
        }
        Ok(Checked {
            session: text("sid"),
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// An introspection endpoint that holds every request it receives until the test ends.
    async fn holding_endpoint() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/introspect", listener.local_addr().unwrap());
        let received = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&received);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = conn.read(&mut buf).await;
                    counted.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                    drop(conn);
                });
            }
        });
        (url, received)
    }

    /// An introspection endpoint that answers every request with `answer`.
    async fn answering_endpoint(answer: Value) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/introspect", listener.local_addr().unwrap());
        let body = answer.to_string();
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let _ = conn.write_all(response.as_bytes()).await;
            }
        });
        url
    }

    async fn introspected(answer: Value) -> Result<Checked, AuthError> {
        let url = answering_endpoint(answer).await;
        let checker = Introspector::new(reqwest::Client::new(), url, "rs".into(), "s".into());
        let audiences = ["https://mcp.example.com".to_owned()];
        checker
            .check("t", "https://as.example.com", &audiences)
            .await
    }

    /// RFC 7519 §2: a NumericDate may have a fraction; it still expires.
    #[tokio::test]
    async fn a_fractional_exp_is_an_expiry_and_a_malformed_one_is_refused() {
        let answer = |exp: Value| {
            serde_json::json!({
                "active": true, "sub": "alice", "aud": "https://mcp.example.com", "exp": exp
            })
        };
        let past = now_secs() as f64 - 60.5;
        assert_eq!(
            introspected(answer(past.into())).await.unwrap_err(),
            AuthError::Expired
        );
        let future = now_secs() + 60;
        let checked = introspected(answer((future as f64 + 0.5).into()))
            .await
            .unwrap();
        assert_eq!(checked.expires_at, future);
        for bad in [serde_json::json!("soon"), serde_json::json!(-1)] {
            assert_eq!(
                introspected(answer(bad.clone())).await.unwrap_err(),
                AuthError::InvalidToken,
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn a_sender_constrained_token_is_refused() {
        let answer = serde_json::json!({
            "active": true, "sub": "alice", "aud": "https://mcp.example.com",
            "cnf": { "jkt": "0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I" }
        });
        assert_eq!(
            introspected(answer).await.unwrap_err(),
            AuthError::SenderConstrained
        );
    }

    #[tokio::test]
    async fn introspections_in_flight_are_capped() {
        let (url, received) = holding_endpoint().await;
        let checker = Arc::new(Introspector::new(
            reqwest::Client::new(),
            url,
            "rs".into(),
            "secret".into(),
        ));
        let audiences: Arc<[String]> = Arc::from(vec!["https://mcp.example.com".to_owned()]);
        let held: Vec<_> = (0..MAX_IN_FLIGHT)
            .map(|i| {
                let (checker, audiences) = (Arc::clone(&checker), Arc::clone(&audiences));
                tokio::spawn(async move {
                    checker
                        .check(&format!("t{i}"), "https://as.example.com", &audiences)
                        .await
                })
            })
            .collect();
        // Every one of them reached the endpoint, which holds them.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while received.load(Ordering::SeqCst) < MAX_IN_FLIGHT {
            assert!(
                std::time::Instant::now() < deadline,
                "requests never arrived"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let refused = checker
            .check("one-more", "https://as.example.com", &audiences)
            .await
            .unwrap_err();
        assert_eq!(refused, AuthError::Unavailable);
        assert_eq!(received.load(Ordering::SeqCst), MAX_IN_FLIGHT, "not sent");
        for h in held {
            h.abort();
        }
    }
}
