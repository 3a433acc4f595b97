//! Answerers: who fulfils the input a server asks for (MRTR `inputRequests` in 2026-07-28,
//! server requests on the call's stream in the legacy era).

use std::collections::BTreeMap;
use std::future::Future;

use serde_json::Value;
use wharf_protocol::{ElicitParams, InputRequest};

/// Why an input request got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no answer to the server's input request {key:?} ({what}): {reason}")]
pub struct Unanswered {
    /// The key the server gave the request (the method, in the legacy era).
    pub key: String,
    /// What was asked, in a few words.
    pub what: String,
    /// Why it was not answered.
    pub reason: String,
}

impl Unanswered {
    /// `request` under `key` left unanswered for `reason`.
    pub fn new(key: &str, request: &InputRequest, reason: impl Into<String>) -> Self {
        Unanswered {
            key: key.to_owned(),
            what: describe(request),
            reason: reason.into(),
        }
    }
}

/// Fulfils input requests: an elicitation, a sampling request or a roots listing.
///
/// The answer is the result the request's method would return (`ElicitResult`,
/// `CreateMessageResult`, `ListRootsResult`), as JSON; the server validates it.
pub trait Answerer: Send {
    /// Answers the request the server filed under `key`.
    fn answer(
        &mut self,
        key: &str,
        request: &InputRequest,
    ) -> impl Future<Output = Result<Value, Unanswered>> + Send;
}

/// Answers nothing: every request is an [`Unanswered`] naming what was asked.
#[derive(Debug, Clone, Copy, Default)]
pub struct Refuse;

impl Answerer for Refuse {
    async fn answer(&mut self, key: &str, request: &InputRequest) -> Result<Value, Unanswered> {
        Err(Unanswered::new(
            key,
            request,
            "this client answers no input",
        ))
    }
}

/// Answers given in advance, by key; requests without one go to `fallback`.
#[derive(Debug, Clone)]
pub struct Prepared<A> {
    answers: BTreeMap<String, Value>,
    fallback: A,
}

impl<A: Answerer> Prepared<A> {
    /// `answers` by key, then `fallback`.
    pub fn new(answers: BTreeMap<String, Value>, fallback: A) -> Self {
        Prepared { answers, fallback }
    }
}

impl<A: Answerer> Answerer for Prepared<A> {
    async fn answer(&mut self, key: &str, request: &InputRequest) -> Result<Value, Unanswered> {
        // An answer is used for every round that asks under its key, as a retry would.
        match self.answers.get(key) {
            Some(answer) => Ok(answer.clone()),
            None => self.fallback.answer(key, request).await,
        }
    }
}

/// What an input request asks, in a few words (for prompts and errors).
pub fn describe(request: &InputRequest) -> String {
    match request {
        InputRequest::Elicit(ElicitParams::Form(f)) => format!("a form: {}", f.message),
        InputRequest::Elicit(ElicitParams::Url(u)) => {
            format!("a visit to {}: {}", u.url, u.message)
        }
        InputRequest::CreateMessage(_) => "a reply from your model (sampling)".to_owned(),
        InputRequest::ListRoots(_) => "your roots".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn roots() -> InputRequest {
        serde_json::from_value(json!({ "method": "roots/list" })).unwrap()
    }

    #[tokio::test]
    async fn prepared_answers_go_by_key_and_the_rest_falls_through() {
        let mut answers = Prepared::new(
            BTreeMap::from([("r".to_owned(), json!({ "roots": [] }))]),
            Refuse,
        );
        assert_eq!(
            answers.answer("r", &roots()).await.unwrap(),
            json!({ "roots": [] })
        );
        let refused = answers.answer("other", &roots()).await.unwrap_err();
        assert_eq!(refused.key, "other");
        assert_eq!(refused.what, "your roots");
    }
}
