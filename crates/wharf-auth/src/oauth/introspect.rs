//! Opaque access tokens checked by introspection (RFC 7662).

use std::time::{Duration, Instant};

use serde_json::Value;
use wharf::Grant;
use wharf::metrics::Throttled;

use super::{Checked, audience_ok, now_secs, numeric_date, scopes_of, subject_of};
use crate::AuthError;

/// How often a warning any client can set off is logged at most.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// How hard one process may press the authorization server's introspection endpoint.
/// Every token the process has not seen costs a request there (tokens already checked are
/// cached, and concurrent checks of one token share one request); a flood of made-up tokens
/// waits its turn, then gets 503, instead of becoming a flood of requests there.
///
/// Re-checks of tokens this process accepted before (their cached answer ran out, the token
/// has not expired) go through limits of their own, the same as these: made-up tokens cannot
/// take their turn, so a flood of them does not sign out the clients already working. The
/// endpoint may so see up to twice these limits. What was accepted is remembered in the
/// token cache (even with no cache TTL) while there is room, not across restarts: a token
/// forgotten is checked as a new one.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct IntrospectionLimits {
    /// Requests in flight at once (in each lane).
    pub max_in_flight: usize,
    /// Requests started per second, on average (in bursts of up to `max_in_flight`; in each
    /// lane).
    pub per_second: u32,
    /// How long a check waits for its turn under the two limits above before it is answered
    /// 503: a burst of new tokens (clients reconnecting after a deploy) is smoothed, not
    /// refused.
    pub max_wait: Duration,
}

impl Default for IntrospectionLimits {
    fn default() -> Self {
        IntrospectionLimits {
            max_in_flight: 32,
            per_second: 200,
            max_wait: Duration::from_secs(2),
        }
    }
}

impl IntrospectionLimits {
    /// These limits with `max_in_flight` requests at once and `per_second` a second
    /// (each at least 1).
    pub fn new(max_in_flight: usize, per_second: u32) -> Self {
        IntrospectionLimits {
            max_in_flight: max_in_flight.max(1),
            per_second: per_second.max(1),
            ..Self::default()
        }
    }
}

/// A token bucket of `limits.max_in_flight` tokens refilled at `limits.per_second`, from
/// which a request may reserve a token that is not there yet and wait for it.
#[derive(Debug)]
struct Budget {
    burst: f64,
    rate: f64,
    state: std::sync::Mutex<(f64, Instant)>,
}

impl Budget {
    fn new(limits: &IntrospectionLimits, now: Instant) -> Self {
        let burst = limits.max_in_flight as f64;
        Budget {
            burst,
            rate: f64::from(limits.per_second),
            state: std::sync::Mutex::new((burst, now)),
        }
    }

    /// Reserves one request's worth at `now`: how long to wait for it, or `None` when that
    /// would be longer than `within` (nothing is reserved then).
    fn reserve(&self, now: Instant, within: Duration) -> Option<Duration> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (left, at) = &mut *state;
        let earned = now.saturating_duration_since(*at).as_secs_f64() * self.rate;
        *left = (*left + earned).min(self.burst);
        *at = now.max(*at);
        // Tokens reserved ahead leave `left` below zero: the next reservation waits for them
        // too.
        let wait = Duration::from_secs_f64(((1.0 - *left) / self.rate).max(0.0));
        if wait > within {
            return None;
        }
        *left -= 1.0;
        Some(wait)
    }
}

/// Whether a token was accepted before: its re-check goes through a lane of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// A token this process has not accepted (or no longer remembers).
    New,
    /// A token accepted before whose cached answer ran out.
    Accepted,
}

/// One way to the endpoint: the requests in flight on it and their rate.
#[derive(Debug)]
struct Lane {
    in_flight: tokio::sync::Semaphore,
    budget: Budget,
}

impl Lane {
    fn new(limits: &IntrospectionLimits) -> Self {
        Lane {
            in_flight: tokio::sync::Semaphore::new(limits.max_in_flight),
            budget: Budget::new(limits, Instant::now()),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Introspector {
    http: super::HttpClients,
    endpoint: String,
    client_id: String,
    client_secret: crate::Secret,
    new_tokens: Lane,
    accepted_tokens: Lane,
    limits: IntrospectionLimits,
}

impl Introspector {
    pub(crate) fn new(
        http: super::HttpClients,
        endpoint: String,
        client_id: String,
        client_secret: crate::Secret,
        limits: IntrospectionLimits,
    ) -> Self {
        // Fields set by hand skip `IntrospectionLimits::new`: no limit may stop every check,
        // divide by zero, or put a deadline past what the clock holds.
        let limits = IntrospectionLimits {
            max_in_flight: limits
                .max_in_flight
                .clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
            per_second: limits.per_second.max(1),
            max_wait: limits.max_wait.min(Duration::from_secs(3600)),
        };
        Introspector {
            http,
            endpoint,
            client_id,
            client_secret,
            new_tokens: Lane::new(&limits),
            accepted_tokens: Lane::new(&limits),
            limits,
        }
    }

    /// Asks the endpoint about `token`, in the lane `seen` names, and checks the answer: an
    /// active access token of `issuer` for one of `audiences`, within its `nbf` (give or
    /// take `leeway`) and `exp`.
    pub(crate) async fn check(
        &self,
        token: &str,
        seen: Seen,
        issuer: &str,
        audiences: &[String],
        leeway: Duration,
    ) -> Result<Checked, AuthError> {
        let limits = &self.limits;
        let lane = match seen {
            Seen::New => &self.new_tokens,
            Seen::Accepted => &self.accepted_tokens,
        };
        let deadline = tokio::time::Instant::now() + limits.max_wait;
        // Any client can set these off with made-up tokens, one per request: a line at most
        // every ten seconds each, saying how many it stands for.
        static AT_LIMIT: Throttled = Throttled::new(WARN_EVERY);
        static AT_RATE: Throttled = Throttled::new(WARN_EVERY);
        static UNREACHABLE: Throttled = Throttled::new(WARN_EVERY);
        static REFUSED: Throttled = Throttled::new(WARN_EVERY);
        let Ok(Ok(_slot)) = tokio::time::timeout_at(deadline, lane.in_flight.acquire()).await
        else {
            if let Some(held_back) = AT_LIMIT.ready() {
                tracing::warn!(
                    limit = limits.max_in_flight,
                    ?seen,
                    held_back,
                    "introspection requests at their limit; a token is refused for now"
                );
            }
            return Err(AuthError::Unavailable);
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let Some(wait) = lane.budget.reserve(Instant::now(), left) else {
            if let Some(held_back) = AT_RATE.ready() {
                tracing::warn!(
                    per_second = limits.per_second,
                    ?seen,
                    held_back,
                    "introspection requests at their rate; a token is refused for now"
                );
            }
            return Err(AuthError::Unavailable);
        };
        tokio::time::sleep(wait).await;
        let request = self.http.to(&self.endpoint).post(&self.endpoint);
        let res = super::client_basic_auth(request, &self.client_id, self.client_secret.expose())
            .form(&[("token", token), ("token_type_hint", "access_token")])
            .send()
            .await
            .map_err(|e| {
                if let Some(held_back) = UNREACHABLE.ready() {
                    tracing::warn!(error = %e, held_back, "cannot reach the introspection endpoint");
                }
                AuthError::Unavailable
            })?;
        if !res.status().is_success() {
            if let Some(held_back) = REFUSED.ready() {
                tracing::warn!(status = %res.status(), held_back, "the introspection endpoint refused");
            }
            return Err(AuthError::Unavailable);
        }
        let answer = super::json_at_most(res, super::MAX_VERDICT_BODY)
            .await
            .and_then(|v| match v {
                Value::Object(answer) => Some(answer),
                _ => None,
            })
            .ok_or(AuthError::Unavailable)?;
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
        // Give or take the leeway, as `nbf` below and a JWT's `exp`.
        if expires_at.saturating_add(leeway.as_secs()) <= now {
            return Err(AuthError::Expired);
        }
        // A server may call a token issued for later active; it is not usable yet.
        if let Some(nbf) = answer.get("nbf") {
            let nbf = numeric_date(nbf).ok_or(AuthError::InvalidToken)?;
            if nbf > now.saturating_add(leeway.as_secs()) {
                return Err(AuthError::NotYetValid);
            }
        }
        Ok(Checked {
            session: text("sid"),
            expires_at,
            grant: Grant {
                issuer: issuer.to_owned(),
                subject: subject_of(&answer)?,
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

    use super::*;
    use crate::oauth::peer::{self, Answer, until_received};

    const ISSUER: &str = "https://as.example.com";
    const LEEWAY: Duration = Duration::from_secs(30);

    /// An introspection endpoint answering as `answer` says: its URL and how many requests
    /// it got.
    async fn endpoint(answer: Answer) -> (String, Arc<AtomicUsize>) {
        let peer = peer::start(|_| answer).await;
        (format!("{}/introspect", peer.origin), peer.requests)
    }

    /// An introspection endpoint that answers every request with `answer`.
    async fn answering_endpoint(answer: Value) -> String {
        endpoint(Answer::Every(peer::json_ok(&answer.to_string())))
            .await
            .0
    }

    async fn introspected(answer: Value) -> Result<Checked, AuthError> {
        let url = answering_endpoint(answer).await;
        let checker = Introspector::new(
            crate::HttpClients::new(reqwest::Client::builder).unwrap(),
            url,
            "rs".into(),
            "s".into(),
            IntrospectionLimits::default(),
        );
        let audiences = ["https://mcp.example.com".to_owned()];
        checker
            .check("t", Seen::New, ISSUER, &audiences, LEEWAY)
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

    /// The clock leeway covers `exp` as it covers `nbf` (and a JWT's `exp`): a token the
    /// issuer's clock expired a moment ago by ours is accepted, one past the leeway is not.
    #[tokio::test]
    async fn the_leeway_covers_exp() {
        let answer = |exp: u64| {
            serde_json::json!({
                "active": true, "sub": "alice", "aud": "https://mcp.example.com", "exp": exp
            })
        };
        assert!(introspected(answer(now_secs() - 5)).await.is_ok());
        assert_eq!(
            introspected(answer(now_secs() - 31)).await.unwrap_err(),
            AuthError::Expired
        );
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

    fn limits(max_in_flight: usize, per_second: u32, max_wait: Duration) -> IntrospectionLimits {
        IntrospectionLimits {
            max_in_flight,
            per_second,
            max_wait,
        }
    }

    /// A checker of tokens at `url` under `limits`, as a function that starts one check on
    /// a task of its own.
    fn spawning_checker(
        url: String,
        limits: IntrospectionLimits,
    ) -> impl Fn(&'static str, Seen) -> tokio::task::JoinHandle<Result<Checked, AuthError>> {
        let checker = Arc::new(Introspector::new(
            crate::HttpClients::new(reqwest::Client::builder).unwrap(),
            url,
            "rs".into(),
            "secret".into(),
            limits,
        ));
        move |token, seen| {
            let checker = Arc::clone(&checker);
            let audiences = ["https://mcp.example.com".to_owned()];
            tokio::spawn(
                async move { checker.check(token, seen, ISSUER, &audiences, LEEWAY).await },
            )
        }
    }

    #[tokio::test]
    async fn introspections_in_flight_are_capped_and_a_new_one_waits_its_turn() {
        let (url, received) = endpoint(Answer::Never).await;
        let check = spawning_checker(url, limits(2, 1000, Duration::from_millis(200)));
        let spawn_check = |token| check(token, Seen::New);
        let held = [spawn_check("t0"), spawn_check("t1")];
        until_received(&received, 2).await;
        // A third waits for a place, and past its wait is refused without a request.
        let refused = spawn_check("t2").await.unwrap().unwrap_err();
        assert_eq!(refused, AuthError::Unavailable);
        assert_eq!(received.load(Ordering::SeqCst), 2, "not sent");
        // One that waits while a place comes free takes it.
        let waiting = spawn_check("t3");
        tokio::task::yield_now().await;
        held[0].abort();
        until_received(&received, 3).await;
        waiting.abort();
        held[1].abort();
    }

    /// Made-up tokens that hold every place of their lane leave re-checks of tokens
    /// accepted before their own.
    #[tokio::test]
    async fn new_tokens_cannot_take_the_turn_of_tokens_accepted_before() {
        let (url, received) = endpoint(Answer::Never).await;
        let spawn_check = spawning_checker(url, limits(1, 1000, Duration::from_millis(100)));
        let junk = spawn_check("junk", Seen::New);
        until_received(&received, 1).await;
        let refused = spawn_check("more junk", Seen::New).await.unwrap();
        assert_eq!(refused.unwrap_err(), AuthError::Unavailable);
        let known = spawn_check("known", Seen::Accepted);
        until_received(&received, 2).await;
        known.abort();
        junk.abort();
    }

    #[tokio::test]
    async fn a_token_not_valid_yet_is_refused_and_leeway_counts() {
        let answer = |nbf: u64| {
            serde_json::json!({
                "active": true, "sub": "alice", "aud": "https://mcp.example.com", "nbf": nbf
            })
        };
        let soon = now_secs() + LEEWAY.as_secs() / 2;
        assert!(introspected(answer(soon)).await.is_ok());
        let later = now_secs() + LEEWAY.as_secs() + 60;
        assert_eq!(
            introspected(answer(later)).await.unwrap_err(),
            AuthError::NotYetValid
        );
    }

    /// The principal is the token's `sub`: an answer without one (or with an empty one, or
    /// one that is not a string) is refused, never given the principal of its client, which
    /// every user of that client would share.
    #[tokio::test]
    async fn a_token_must_name_its_subject() {
        let user = serde_json::json!({
            "active": true, "sub": "alice", "client_id": "app", "aud": "https://mcp.example.com"
        });
        assert_eq!(introspected(user).await.unwrap().grant.subject, "alice");
        for sub in [
            None,
            Some(serde_json::json!("")),
            Some(serde_json::json!(42)),
        ] {
            let mut nobody = serde_json::json!({
                "active": true, "client_id": "app", "aud": "https://mcp.example.com"
            });
            if let Some(sub) = sub {
                nobody["sub"] = sub;
            }
            assert_eq!(
                introspected(nobody.clone()).await.unwrap_err(),
                AuthError::InvalidToken,
                "{nobody}"
            );
        }
    }

    /// Limits set field by field are made usable: at least one request at once and a
    /// second, a wait the clock can hold.
    #[tokio::test]
    async fn limits_that_would_stop_every_check_are_raised() {
        let audiences = ["https://mcp.example.com".to_owned()];
        // Zeros, and "no limit" spelled as the largest numbers (more than a semaphore holds).
        for given in [
            limits(0, 0, Duration::MAX),
            limits(usize::MAX, u32::MAX, Duration::ZERO),
        ] {
            let url = answering_endpoint(serde_json::json!({ "active": false })).await;
            let checker = Introspector::new(
                crate::HttpClients::new(reqwest::Client::builder).unwrap(),
                url,
                "rs".into(),
                "s".into(),
                given,
            );
            for token in ["a", "b"] {
                let checked = checker
                    .check(token, Seen::New, ISSUER, &audiences, LEEWAY)
                    .await;
                assert_eq!(checked.map(|_| ()), Err(AuthError::Inactive), "{given:?}");
            }
        }
    }

    #[test]
    fn the_rate_lets_a_burst_through_then_spaces_requests_out() {
        let start = Instant::now();
        let budget = Budget::new(&limits(2, 10, Duration::ZERO), start);
        let within = Duration::from_millis(250);
        assert_eq!(budget.reserve(start, within), Some(Duration::ZERO));
        assert_eq!(budget.reserve(start, within), Some(Duration::ZERO));
        // Then a tenth of a second apart, each behind those reserved before it.
        let wait = |d: Option<Duration>| d.map(|d| d.as_millis());
        assert_eq!(wait(budget.reserve(start, within)), Some(100));
        assert_eq!(wait(budget.reserve(start, within)), Some(200));
        // Beyond the wait allowed: refused, and nothing reserved.
        assert_eq!(budget.reserve(start, within), None);
        let later = start + Duration::from_millis(300);
        assert_eq!(wait(budget.reserve(later, within)), Some(0));
    }
}
