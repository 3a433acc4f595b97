//! Multi-round-trip requests (MRTR): a handler of `tools/call`, `prompts/get` or
//! `resources/read` that needs something from the client (an answer from the user, a model
//! completion, the client's roots) returns [`Ask`] instead of a result. The client answers
//! and retries with the same params, its `inputResponses` and the sealed `requestState`;
//! the handler runs again from the top and reads the answers, typed, on its [`Context`](crate::Context).
//! Nothing is held in memory between rounds: any replica with the same state keys resumes.

pub(crate) mod seal;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use wharf_protocol::{
    ClientCapabilities, CreateMessageParams, CreateMessageResult, ElicitFormParams, ElicitParams,
    ElicitUrlParams, ElicitationCapability, InputRequest, InputRequests, InputResponses,
    ListRootsResult,
};

use seal::{Asked, SealedState};
pub use seal::{KeyError, StateKeys};

use crate::error::RpcError;
use crate::principal::Principal;
use crate::store::{Digest, Millis, after, now_millis};

/// How request states are sealed and for how long they hold: start from
/// [`StateConfig::default`] and set what differs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StateConfig {
    /// Fixed keys. `None` (the default): the keys every replica on the store shares and
    /// rotates, or a random key of this process when there is no store.
    pub keys: Option<StateKeys>,
    /// How long a state stays valid (default 10 minutes).
    pub max_age: Duration,
    /// The most rounds one request may take (default 8).
    pub max_rounds: u32,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            keys: None,
            max_age: Duration::from_secs(600),
            max_rounds: 8,
        }
    }
}

/// A field type of a form elicitation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StringFormat {
    /// An email address.
    Email,
    /// A URI.
    Uri,
    /// A calendar date (`2026-11-30`).
    Date,
    /// A date and time (RFC 3339).
    DateTime,
}

/// The schema of what a form elicitation asks for: a flat object of primitive fields, as
/// the specification allows.
#[derive(Debug, Clone, Default)]
pub struct FormSchema {
    properties: Map<String, Value>,
    required: Vec<String>,
}

impl FormSchema {
    /// An empty form.
    pub fn new() -> Self {
        Self::default()
    }

    fn field(mut self, name: &str, schema: Value, required: bool) -> Self {
        self.properties.insert(name.to_owned(), schema);
        // A field defined again replaces the first, in `required` too: a name listed twice
        // makes the schema invalid (2020-12: its items are unique).
        self.required.retain(|r| r != name);
        if required {
            self.required.push(name.to_owned());
        }
        self
    }

    /// A text field.
    pub fn string(self, name: &str, description: &str, required: bool) -> Self {
        self.field(
            name,
            json!({ "type": "string", "description": description }),
            required,
        )
    }

    /// A text field with a format (email, URI, date, date-time).
    pub fn formatted(
        self,
        name: &str,
        description: &str,
        format: StringFormat,
        required: bool,
    ) -> Self {
        let format = match format {
            StringFormat::Email => "email",
            StringFormat::Uri => "uri",
            StringFormat::Date => "date",
            StringFormat::DateTime => "date-time",
        };
        self.field(
            name,
            json!({ "type": "string", "description": description, "format": format }),
            required,
        )
    }

    /// A number field, optionally bounded.
    pub fn number(
        self,
        name: &str,
        description: &str,
        bounds: (Option<f64>, Option<f64>),
        required: bool,
    ) -> Self {
        self.bounded("number", name, description, bounds, required)
    }

    /// An integer field, optionally bounded.
    pub fn integer(
        self,
        name: &str,
        description: &str,
        bounds: (Option<f64>, Option<f64>),
        required: bool,
    ) -> Self {
        self.bounded("integer", name, description, bounds, required)
    }

    fn bounded(
        self,
        kind: &str,
        name: &str,
        description: &str,
        (min, max): (Option<f64>, Option<f64>),
        required: bool,
    ) -> Self {
        let mut schema = json!({ "type": kind, "description": description });
        // An infinite bound bounds nothing, and NaN none: JSON has neither (serde_json
        // writes them as null, which a client's schema check refuses).
        if let Some(min) = min.filter(|m| m.is_finite()) {
            schema["minimum"] = json!(min);
        }
        if let Some(max) = max.filter(|m| m.is_finite()) {
            schema["maximum"] = json!(max);
        }
        self.field(name, schema, required)
    }

    /// A yes/no field.
    pub fn boolean(self, name: &str, description: &str, required: bool) -> Self {
        self.field(
            name,
            json!({ "type": "boolean", "description": description }),
            required,
        )
    }

    /// A choice among `options`.
    pub fn choice(self, name: &str, description: &str, options: &[&str], required: bool) -> Self {
        self.field(
            name,
            json!({ "type": "string", "description": description, "enum": options }),
            required,
        )
    }

    /// A choice among `options`, each a value and the title a person sees (SEP-1330).
    pub fn titled_choice(
        self,
        name: &str,
        description: &str,
        options: &[(&str, &str)],
        required: bool,
    ) -> Self {
        let one_of: Vec<Value> = options
            .iter()
            .map(|(value, title)| json!({ "const": value, "title": title }))
            .collect();
        self.field(
            name,
            json!({ "type": "string", "description": description, "oneOf": one_of }),
            required,
        )
    }

    /// A choice among `options` shown as `names`, in the `enumNames` form clients of
    /// 2025-06-18 read (deprecated since: prefer [`FormSchema::titled_choice`]).
    pub fn named_choice(
        self,
        name: &str,
        description: &str,
        options: &[&str],
        names: &[&str],
        required: bool,
    ) -> Self {
        self.field(
            name,
            json!({ "type": "string", "description": description, "enum": options, "enumNames": names }),
            required,
        )
    }

    /// Several of `options`, at least and at most as many as `count` says (SEP-1330).
    pub fn multi_choice(
        self,
        name: &str,
        description: &str,
        options: &[&str],
        count: (Option<u64>, Option<u64>),
        required: bool,
    ) -> Self {
        let items = json!({ "type": "string", "enum": options });
        self.array(name, description, items, count, required)
    }

    /// Several of `options`, each a value and its title, as many as `count` says.
    pub fn titled_multi_choice(
        self,
        name: &str,
        description: &str,
        options: &[(&str, &str)],
        count: (Option<u64>, Option<u64>),
        required: bool,
    ) -> Self {
        let any_of: Vec<Value> = options
            .iter()
            .map(|(value, title)| json!({ "const": value, "title": title }))
            .collect();
        self.array(
            name,
            description,
            json!({ "anyOf": any_of }),
            count,
            required,
        )
    }

    fn array(
        self,
        name: &str,
        description: &str,
        items: Value,
        (min, max): (Option<u64>, Option<u64>),
        required: bool,
    ) -> Self {
        let mut schema = json!({ "type": "array", "description": description, "items": items });
        if let Some(min) = min {
            schema["minItems"] = json!(min);
        }
        if let Some(max) = max {
            schema["maxItems"] = json!(max);
        }
        self.field(name, schema, required)
    }

    /// Gives field `name` a default the client pre-fills (SEP-1034); a form without that
    /// field, or a default of another type than the field's (the request would break the
    /// schema clients check it against), is returned unchanged.
    pub fn with_default(mut self, name: &str, value: impl Into<Value>) -> Self {
        let value = value.into();
        if let Some(Value::Object(field)) = self.properties.get_mut(name) {
            let fits = match field.get("type").and_then(Value::as_str) {
                Some("string") => value.is_string(),
                Some("number") => value.as_f64().is_some_and(f64::is_finite),
                // JSON Schema's integer is any number without a fraction (`3.0` too).
                Some("integer") => value.as_f64().is_some_and(|n| n.fract() == 0.0),
                Some("boolean") => value.is_boolean(),
                // A multiple choice's default: the choices it names, strings all.
                Some("array") => value
                    .as_array()
                    .is_some_and(|a| a.iter().all(Value::is_string)),
                _ => true,
            };
            if fits {
                field.insert("default".into(), value);
            } else {
                tracing::warn!(field = name, %value, "a form default of another type than its field was left out");
            }
        }
        self
    }

    /// The form as the JSON Schema a client is sent.
    fn schema(&self) -> Value {
        Value::Object(self.clone().into_schema())
    }

    fn into_schema(self) -> Map<String, Value> {
        let mut schema = Map::new();
        schema.insert("type".into(), json!("object"));
        schema.insert("properties".into(), Value::Object(self.properties));
        if !self.required.is_empty() {
            schema.insert("required".into(), json!(self.required));
        }
        schema
    }
}

/// What a handler asks the client for before it can finish. Build it with
/// [`Context::ask`](crate::Context::ask) and return it as the handler's error (`?` or
/// `.into()`): the client gets an `input_required` result. Requests for a capability the
/// client did not declare on this request are left out; if nothing would be left to ask,
/// or the round asks again for what the last one had to leave out (the handler cannot
/// finish without it), the answer is `-32021` naming what is missing. A handler that can
/// do without an answer asks for it once: after a round that left it out, its answer
/// reads `None`, and asking for it again ends the request.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    requests: InputRequests,
    asked: BTreeMap<String, Asked>,
    missing: ClientCapabilities,
    state: Option<Value>,
    capabilities: ClientCapabilities,
    /// The keys left out of the previous round (the client could not be asked them).
    left_out_before: BTreeSet<String>,
    /// The keys left out of this one.
    left_out: BTreeSet<String>,
}

impl Ask {
    pub(crate) fn new(capabilities: ClientCapabilities, left_out_before: BTreeSet<String>) -> Self {
        Ask {
            requests: InputRequests::new(),
            asked: BTreeMap::new(),
            missing: ClientCapabilities::default(),
            state: None,
            capabilities,
            left_out_before,
            left_out: BTreeSet::new(),
        }
    }

    fn push(mut self, key: &str, request: InputRequest, asked: Asked, offered: bool) -> Self {
        if offered {
            self.requests.insert(key.to_owned(), request);
            self.asked.insert(key.to_owned(), asked);
        } else {
            self.left_out.insert(key.to_owned());
        }
        self
    }

    /// Whether this round asks again for what the last one had to leave out: the handler
    /// cannot finish without it, and another round would only ask the user the rest again.
    fn needs_what_was_left_out(&self) -> bool {
        !self.left_out.is_disjoint(&self.left_out_before)
    }

    /// Asks the user to fill in a form.
    pub fn elicit(mut self, key: &str, message: impl Into<String>, form: FormSchema) -> Self {
        let schema = form.into_schema();
        let offered = self.capabilities.elicitation.as_ref().is_some_and(|e| {
            // An empty elicitation capability means form mode.
            e.form.is_some() || e.url.is_none()
        });
        if !offered {
            self.missing
                .elicitation
                .get_or_insert_with(ElicitationCapability::default)
                .form = Some(Map::new());
        }
        let request = InputRequest::Elicit(ElicitParams::Form(ElicitFormParams {
            mode: None,
            message: message.into(),
            requested_schema: schema.clone(),
        }));
        self.push(
            key,
            request,
            Asked::Form {
                schema: Value::Object(schema),
            },
            offered,
        )
    }

    /// Sends the user to `url` (out of band: credentials, payment, consent).
    pub fn elicit_url(
        mut self,
        key: &str,
        message: impl Into<String>,
        url: impl Into<String>,
    ) -> Self {
        let offered = self
            .capabilities
            .elicitation
            .as_ref()
            .is_some_and(|e| e.url.is_some());
        if !offered {
            self.missing
                .elicitation
                .get_or_insert_with(ElicitationCapability::default)
                .url = Some(Map::new());
        }
        let request = InputRequest::Elicit(ElicitParams::Url(ElicitUrlParams {
            mode: wharf_protocol::UrlMode::Url,
            message: message.into(),
            url: url.into(),
        }));
        self.push(key, request, Asked::Url, offered)
    }

    /// Asks the client's model for a completion. Tools for the model, or context beyond `none`, need the client to have declared
    /// them too (`sampling.tools`, `sampling.context`).
    pub fn sample(mut self, key: &str, params: CreateMessageParams) -> Self {
        let needed = params.required_sampling();
        let offered = self
            .capabilities
            .sampling
            .as_ref()
            .is_some_and(|declared| declared.covers(&needed));
        if !offered {
            // Added to what earlier requests of the round found missing.
            let missing = self.missing.sampling.get_or_insert_with(Default::default);
            missing.tools = missing.tools.take().or(needed.tools);
            missing.context = missing.context.take().or(needed.context);
        }
        self.push(
            key,
            InputRequest::CreateMessage(params),
            Asked::Sample,
            offered,
        )
    }

    /// Asks for the client's roots.
    pub fn list_roots(mut self, key: &str) -> Self {
        let offered = self.capabilities.roots.is_some();
        if !offered {
            self.missing.roots = Some(Map::new());
        }
        self.push(key, InputRequest::ListRoots(None), Asked::Roots, offered)
    }

    /// Keeps `state` for the next round ([`Context::round_state`](crate::Context::round_state)),
    /// sealed: the client carries it but can neither read nor change it.
    ///
    /// A round that asks nothing and only keeps state needs a request whose client declared
    /// an input capability (`elicitation`, `sampling` or `roots`) or that answers an earlier
    /// round: only those requests have their params digested, to bind the state to them
    /// (every other call would pay for the digest). For any other request it fails with
    /// -32603.
    pub fn state<S: Serialize>(mut self, state: &S) -> Self {
        self.state = serde_json::to_value(state).ok();
        self
    }
}

/// The answers of the current round, and what the previous round asked.
#[derive(Debug, Clone, Default)]
pub(crate) struct Round {
    /// 0 for a fresh request.
    pub(crate) number: u32,
    /// What the previous round asked, when the request carries its state; answers sent
    /// without a state are read for their shape only.
    pub(crate) asked: Option<BTreeMap<String, Asked>>,
    pub(crate) responses: InputResponses,
    pub(crate) state: Option<Value>,
    pub(crate) nonce: Option<String>,
    pub(crate) expires_at: Millis,
    /// What the previous round could not ask the client for.
    pub(crate) left_out: BTreeSet<String>,
}

/// The answer to a form elicitation.
#[derive(Debug, Clone, PartialEq)]
pub enum Elicited<T> {
    /// The user submitted the form; its content, checked against the form's schema.
    Accepted(T),
    /// The user said no.
    Declined,
    /// The user dismissed the request.
    Cancelled,
}

impl Round {
    /// The answer to `key`, if it answers what was asked as `key` (of the kind `is`).
    fn answer(&self, key: &str, is: fn(&Asked) -> bool) -> Option<(Option<&Asked>, &Value)> {
        let answer = self.responses.get(key)?;
        match &self.asked {
            Some(asked) => {
                let asked = asked.get(key).filter(|a| is(a))?;
                Some((Some(asked), answer))
            }
            None => Some((None, answer)),
        }
    }

    /// A form answer for `key`: `None` when it is missing or malformed (ask again). Its
    /// content is checked against the form the round's state says was asked or, for answers
    /// sent without a state (nothing says what was asked), against `form`, the one the
    /// handler would ask.
    pub(crate) fn elicited<T: DeserializeOwned>(
        &self,
        key: &str,
        form: &FormSchema,
    ) -> Option<Elicited<T>> {
        let (asked, answer) = self.answer(key, |a| matches!(a, Asked::Form { .. }))?;
        match answer.get("action")?.as_str()? {
            "accept" => {
                let content = answer.get("content")?;
                let schema = match asked {
                    Some(Asked::Form { schema }) => std::borrow::Cow::Borrowed(schema),
                    _ => std::borrow::Cow::Owned(form.schema()),
                };
                // Formats too (email, uri, date, date-time): under draft 2020-12 they are
                // only annotations unless asked for, and a form that asked for an email
                // must not hand the handler any string.
                let validator = jsonschema::options()
                    .should_validate_formats(true)
                    .build(&schema)
                    .ok()?;
                if !validator.is_valid(content) {
                    return None;
                }
                crate::schema::read_validated(content.clone())
                    .ok()
                    .map(Elicited::Accepted)
            }
            "decline" => Some(Elicited::Declined),
            "cancel" => Some(Elicited::Cancelled),
            _ => None,
        }
    }

    /// The action the user took on a URL elicitation.
    pub(crate) fn elicited_url(&self, key: &str) -> Option<Elicited<()>> {
        let (_, answer) = self.answer(key, |a| matches!(a, Asked::Url))?;
        match answer.get("action")?.as_str()? {
            "accept" => Some(Elicited::Accepted(())),
            "decline" => Some(Elicited::Declined),
            "cancel" => Some(Elicited::Cancelled),
            _ => None,
        }
    }

    pub(crate) fn sampled(&self, key: &str) -> Option<CreateMessageResult> {
        let (_, answer) = self.answer(key, |a| matches!(a, Asked::Sample))?;
        serde_json::from_value(answer.clone()).ok()
    }

    pub(crate) fn roots(&self, key: &str) -> Option<ListRootsResult> {
        let (_, answer) = self.answer(key, |a| matches!(a, Asked::Roots))?;
        serde_json::from_value(answer.clone()).ok()
    }
}

/// The request a state is bound to: its method and the digest of its salient params (all but
/// `_meta`, `inputResponses` and `requestState`).
#[derive(Debug, Clone)]
pub(crate) struct Binding {
    pub(crate) method: &'static str,
    pub(crate) digest: String,
}

impl Binding {
    pub(crate) fn new(method: &'static str, name: &str, args: &Map<String, Value>) -> Self {
        Binding {
            method,
            // Every argument, the idempotency key included: a confirmation given for one
            // write never authorizes another.
            digest: Digest::of_all(&format!("{method}\u{0}{name}"), args)
                .as_str()
                .to_owned(),
        }
    }
}

/// The OAuth client `principal` acts through, when its token names one.
fn client_of(principal: &Principal) -> Option<&String> {
    principal.grant()?.client_id.as_ref()
}

/// Why a retry's state was refused (each is -32602 to the client).
#[derive(Debug)]
pub(crate) enum StateRefused {
    /// It was the caller's, and its time ran out: the request it answered may have been
    /// completed since (an idempotent write's retry looks for its result first).
    Expired(RpcError),
    /// Forged, altered, another caller's, or issued for another request.
    Invalid(RpcError),
}

impl From<StateRefused> for RpcError {
    fn from(refused: StateRefused) -> Self {
        match refused {
            StateRefused::Expired(e) | StateRefused::Invalid(e) => e,
        }
    }
}

/// Opens the round a retry carries: its state checked against the caller and the request.
pub(crate) fn open_round(
    keys: &StateKeys,
    binding: &Binding,
    principal: &Principal,
    request_state: Option<&str>,
    responses: Option<InputResponses>,
) -> Result<Round, StateRefused> {
    let Some(token) = request_state else {
        // Answers without a state: read for their shape only.
        return Ok(Round {
            responses: responses.unwrap_or_default(),
            ..Round::default()
        });
    };
    let refuse = |why: &str| RpcError::invalid_params(format!("Invalid requestState: {why}"));
    // Another principal's state is refused as if it were forged, before its expiry is
    // looked at: nothing tells the caller that it is genuine.
    // A state sealed without a client (by a replica before this rule, or for a principal
    // without one) binds the principal alone.
    let state = keys
        .open(token)
        .filter(|state| state.principal == principal.id())
        .filter(|state| {
            state
                .client
                .as_ref()
                .is_none_or(|c| Some(c) == client_of(principal))
        })
        .ok_or_else(|| {
            StateRefused::Invalid(refuse("it was not issued by this server to this caller, or was altered; send the request again without requestState and inputResponses"))
        })?;
    let now = now_millis();
    if state.expires_at <= now {
        return Err(StateRefused::Expired(refuse(&format!(
            "it expired {} s ago; send the request again without requestState and inputResponses",
            (now - state.expires_at) / 1000
        ))));
    }
    if state.method != binding.method || state.digest != binding.digest {
        return Err(StateRefused::Invalid(refuse(
            "it was issued for another request (the method or its params differ); retry with the same params as the request that returned it",
        )));
    }
    Ok(Round {
        number: state.round,
        asked: Some(state.asked),
        responses: responses.unwrap_or_default(),
        state: state.state,
        nonce: Some(state.nonce),
        expires_at: state.expires_at,
        left_out: state.left_out,
    })
}

/// What of sampling request `p` its schema refuses and its type does not, if anything: a
/// resource link or embedded resource in a message (sampling takes text, images, audio, tool
/// uses and tool results), a URI in a tool result that is not one, a tool's icon likewise.
fn sampling_problem(p: &wharf_protocol::CreateMessageParams) -> Option<String> {
    use wharf_protocol::{Content, SamplingBlock, SamplingContent};
    for message in &p.messages {
        let blocks = match &message.content {
            SamplingContent::One(block) => std::slice::from_ref(block.as_ref()),
            SamplingContent::Many(blocks) => blocks.as_slice(),
        };
        for block in blocks {
            match block {
                SamplingBlock::Content(Content::ResourceLink(_) | Content::Resource(_)) => {
                    return Some(
                        "a sampling message holds a resource link or embedded resource; sampling takes text, images, audio, tool uses and tool results".into(),
                    );
                }
                SamplingBlock::ToolResult(result) => {
                    if let Some(uri) = crate::uri_template::bad_content_uri(&result.content) {
                        return Some(format!(
                            "a tool result in a sampling message carries {uri:?}, which is not a URI (RFC 3986)"
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    let icons = p
        .tools
        .iter()
        .flatten()
        .flat_map(|t| t.icons.iter().flatten());
    icons
        .map(|icon| &icon.src)
        .find(|src| !crate::uri_template::is_uri(src))
        .map(|src| {
            format!(
                "a tool offered to the model has the icon {src:?}, which is not a URI (RFC 3986)"
            )
        })
}

/// Turns a handler's [`Ask`] into the parts of an `input_required` result: the requests and
/// the sealed state of the next round.
pub(crate) fn seal_round(
    config: &StateConfig,
    keys: &StateKeys,
    bound: Option<(&Binding, &Principal)>,
    previous: u32,
    ask: Ask,
) -> Result<(Option<InputRequests>, String), RpcError> {
    // What the schema holds an input request to that its types do not: a URL elicitation's
    // `url` is a URI, and a sampling message holds text, images, audio, tool uses and tool
    // results only.
    for (key, request) in &ask.requests {
        match request {
            InputRequest::Elicit(ElicitParams::Url(p)) if !crate::uri_template::is_uri(&p.url) => {
                return Err(RpcError::internal(format!(
                    "input request {key:?} sends the user to {:?}, which is not a URI (RFC 3986)",
                    p.url
                )));
            }
            // Checked before the client sees it: answers are read against it, and one that
            // does not compile would refuse every answer, round after round.
            InputRequest::Elicit(ElicitParams::Form(p)) => {
                let schema = Value::Object(p.requested_schema.clone());
                if let Err(e) = jsonschema::options()
                    .should_validate_formats(true)
                    .build(&schema)
                {
                    return Err(RpcError::internal(format!(
                        "input request {key:?} asks for a form whose schema is not valid JSON Schema: {e}"
                    )));
                }
            }
            InputRequest::CreateMessage(p) => {
                if let Some(problem) = sampling_problem(p) {
                    return Err(RpcError::internal(format!(
                        "input request {key:?}: {problem}"
                    )));
                }
            }
            _ => {}
        }
    }
    if (ask.requests.is_empty() || ask.needs_what_was_left_out())
        && ask.missing != ClientCapabilities::default()
    {
        return Err(RpcError::missing_capability(
            &ask.missing,
            "this request asks the client for input and",
        ));
    }
    let (binding, principal) = bound.ok_or_else(|| {
        RpcError::internal(
            "a handler kept state, asking nothing, for a client that declared no input capability (see Ask::state)",
        )
    })?;
    let round = previous + 1;
    if round > config.max_rounds {
        return Err(RpcError::invalid_params(format!(
            "This request took more than {} rounds of input; it was stopped. Send it again from the start.",
            config.max_rounds
        )));
    }
    let nonce: [u8; 16] = rand::random();
    let sealed = SealedState {
        principal: principal.id().to_owned(),
        client: client_of(principal).cloned(),
        expires_at: after(now_millis(), config.max_age),
        method: binding.method.to_owned(),
        digest: binding.digest.clone(),
        round,
        nonce: nonce.iter().map(|b| format!("{b:02x}")).collect(),
        asked: ask.asked,
        state: ask.state,
        left_out: ask.left_out,
    };
    let token = keys.seal(&sealed)?;
    let requests = (!ask.requests.is_empty()).then_some(ask.requests);
    Ok((requests, token))
}

/// A request's part in MRTR: what its state is bound to and the round it carries.
pub(crate) struct Turn {
    pub(crate) binding: Binding,
    pub(crate) round: Round,
}

/// What sealing the next round of a request needs once its handler has the round:
/// see [`Context::enter_turn`](crate::Context).
pub(crate) struct Resume {
    pub(crate) binding: Binding,
    /// The round the request carried (0 for a fresh one).
    pub(crate) round: u32,
    pub(crate) principal: Principal,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn caps(v: Value) -> ClientCapabilities {
        serde_json::from_value(v).unwrap()
    }

    fn binding() -> Binding {
        Binding::new("tools/call", "t", &Map::new())
    }

    /// What JSON cannot hold or the field's type does not take stays out of a form: an
    /// infinite or NaN bound, a default of another type. Finite ones stay.
    #[test]
    fn a_form_holds_only_what_its_schema_takes() {
        let form = FormSchema::new()
            .number("ratio", "Ratio", (Some(f64::NEG_INFINITY), Some(1.5)), true)
            .integer("n", "N", (Some(f64::NAN), None), false)
            .string("name", "Name", false)
            .with_default("name", 5)
            .with_default("n", 3)
            .multi_choice("tags", "Tags", &["a", "b"], (None, None), false)
            .with_default("tags", json!([1]))
            .multi_choice("more", "More", &["a", "b"], (None, None), false)
            .with_default("more", json!(["b"]))
            .schema();
        assert!(form["properties"]["tags"].get("default").is_none());
        assert_eq!(form["properties"]["more"]["default"], json!(["b"]));
        assert_eq!(form["properties"]["ratio"]["maximum"], 1.5);
        assert!(form["properties"]["ratio"].get("minimum").is_none());
        assert!(form["properties"]["n"].get("minimum").is_none());
        assert!(form["properties"]["name"].get("default").is_none());
        assert_eq!(form["properties"]["n"]["default"], 3);
    }

    /// A sampling request's temperature and priorities are written only when they are
    /// numbers the schema takes.
    #[test]
    fn a_sampling_request_leaves_out_numbers_its_schema_refuses() {
        let mut params: wharf_protocol::CreateMessageParams =
            serde_json::from_value(json!({ "messages": [], "maxTokens": 5 })).unwrap();
        params.temperature = Some(f64::NAN);
        params.model_preferences = Some(wharf_protocol::ModelPreferences {
            cost_priority: Some(2.0),
            speed_priority: Some(0.5),
            ..Default::default()
        });
        let written = serde_json::to_value(&params).unwrap();
        assert!(written.get("temperature").is_none(), "{written}");
        assert_eq!(
            written["modelPreferences"],
            json!({ "speedPriority": 0.5 }),
            "{written}"
        );
    }

    #[test]
    fn only_declared_capabilities_are_asked_and_none_left_is_32021() {
        let ask = Ask::new(caps(json!({ "sampling": {} })), BTreeSet::new())
            .elicit(
                "name",
                "Name?",
                FormSchema::new().string("name", "Name", true),
            )
            .list_roots("roots")
            .sample(
                "q",
                serde_json::from_value(json!({ "messages": [], "maxTokens": 5 })).unwrap(),
            );
        assert_eq!(ask.requests.keys().collect::<Vec<_>>(), ["q"]);
        let config = StateConfig::default();
        let keys = StateKeys::random();
        let who = Principal::anonymous();
        let (requests, _) = seal_round(&config, &keys, Some((&binding(), &who)), 0, ask).unwrap();
        assert_eq!(requests.unwrap().len(), 1);

        let ask = Ask::new(caps(json!({})), BTreeSet::new()).elicit(
            "name",
            "Name?",
            FormSchema::new().string("name", "Name", true),
        );
        let e = seal_round(&config, &keys, Some((&binding(), &who)), 0, ask).unwrap_err();
        assert_eq!(e.kind, ErrorKind::MissingCapability);
        assert!(e.data.unwrap()["requiredCapabilities"]["elicitation"].is_object());
    }

    /// A form is checked before it is sent: one whose schema does not compile (a choice of
    /// nothing) is the server's error, not a round the user answers in vain; a field
    /// defined twice is listed once as required.
    #[test]
    fn forms_are_valid_json_schema_before_they_are_sent() {
        let config = StateConfig::default();
        let keys = StateKeys::random();
        let who = Principal::anonymous();
        let asked = |form: FormSchema| {
            let ask = Ask::new(caps(json!({ "elicitation": {} })), BTreeSet::new())
                .elicit("f", "F?", form);
            seal_round(&config, &keys, Some((&binding(), &who)), 0, ask)
        };
        let twice = FormSchema::new()
            .string("a", "A", true)
            .string("a", "A again", true);
        assert_eq!(twice.schema()["required"], json!(["a"]));
        asked(twice).unwrap();
        let optional_now = FormSchema::new()
            .string("a", "A", true)
            .string("a", "A", false);
        assert!(optional_now.schema().get("required").is_none());
        let nothing_to_choose = FormSchema::new().titled_choice("c", "C", &[], true);
        // -32603 to the client; what is wrong goes to the log.
        let e = asked(nothing_to_choose).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Internal);
    }

    /// What the client could not be asked is left out of a round; a handler that asks for it
    /// again (it cannot finish without it) gets -32021 naming it, instead of asking the user
    /// the rest again round after round until the cap.
    #[test]
    fn asking_again_for_what_was_left_out_is_32021() {
        let config = StateConfig::default();
        let keys = StateKeys::random();
        let who = Principal::anonymous();
        let declared = || caps(json!({ "elicitation": {} }));
        let form = || FormSchema::new().boolean("ok", "OK", true);
        let ask = |left_out: BTreeSet<String>| {
            Ask::new(declared(), left_out)
                .elicit("ok", "OK?", form())
                .list_roots("roots")
        };
        let (requests, token) = seal_round(
            &config,
            &keys,
            Some((&binding(), &who)),
            0,
            ask(BTreeSet::new()),
        )
        .unwrap();
        assert_eq!(requests.unwrap().keys().collect::<Vec<_>>(), ["ok"]);
        let answered = json!({ "ok": { "action": "accept", "content": { "ok": true } } });
        let round = open_round(
            &keys,
            &binding(),
            &who,
            Some(&token),
            Some(serde_json::from_value(answered).unwrap()),
        )
        .unwrap();
        assert_eq!(round.left_out, BTreeSet::from(["roots".to_owned()]));

        let e = seal_round(
            &config,
            &keys,
            Some((&binding(), &who)),
            1,
            ask(round.left_out.clone()),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::MissingCapability);
        let data = e.data.unwrap();
        assert!(data["requiredCapabilities"]["roots"].is_object(), "{data}");

        // A round that goes on without it is asked as usual.
        let other = Ask::new(declared(), round.left_out).elicit("more", "More?", form());
        let (requests, _) = seal_round(&config, &keys, Some((&binding(), &who)), 1, other).unwrap();
        assert_eq!(requests.unwrap().keys().collect::<Vec<_>>(), ["more"]);
    }

    #[test]
    fn sampling_with_tools_or_context_needs_those_parts_declared() {
        let with_tools = || -> CreateMessageParams {
            serde_json::from_value(json!({
                "messages": [], "maxTokens": 5,
                "tools": [{ "name": "t", "inputSchema": { "type": "object" } }]
            }))
            .unwrap()
        };
        let with_context = || -> CreateMessageParams {
            serde_json::from_value(json!({
                "messages": [], "maxTokens": 5, "includeContext": "thisServer"
            }))
            .unwrap()
        };
        let plain = Ask::new(caps(json!({ "sampling": {} })), BTreeSet::new());
        let asked = plain.sample("q", with_tools());
        assert!(asked.requests.is_empty());
        let missing = serde_json::to_value(&asked.missing).unwrap();
        assert_eq!(missing["sampling"], json!({ "tools": {} }));
        let asked =
            Ask::new(caps(json!({ "sampling": {} })), BTreeSet::new()).sample("q", with_context());
        assert!(asked.requests.is_empty());
        let missing = serde_json::to_value(&asked.missing).unwrap();
        assert_eq!(missing["sampling"], json!({ "context": {} }));

        // Everything a round lacks is named, whatever asked for it first.
        let both = Ask::new(caps(json!({ "sampling": {} })), BTreeSet::new())
            .sample("a", with_tools())
            .sample("b", with_context())
            .sample(
                "c",
                serde_json::from_value(json!({ "messages": [], "maxTokens": 5 })).unwrap(),
            )
            .elicit_url("pay", "Pay", "https://pay.example/1")
            .elicit(
                "name",
                "Name?",
                FormSchema::new().string("name", "Name", true),
            );
        assert_eq!(both.requests.keys().collect::<Vec<_>>(), ["c"]);
        let missing = serde_json::to_value(&both.missing).unwrap();
        assert_eq!(missing["sampling"], json!({ "tools": {}, "context": {} }));
        assert_eq!(missing["elicitation"], json!({ "form": {}, "url": {} }));

        let full = Ask::new(
            caps(json!({ "sampling": { "tools": {}, "context": {} } })),
            BTreeSet::new(),
        )
        .sample("a", with_tools())
        .sample("b", with_context());
        assert_eq!(full.requests.len(), 2);
        // The same rule where a requirement is checked against a declaration.
        let declared = caps(json!({ "sampling": {} }));
        let needed = caps(json!({ "sampling": { "tools": {} } }));
        assert!(!crate::meta::capabilities_cover(&declared, &needed));
        assert!(crate::meta::capabilities_cover(&needed, &declared));
    }

    #[test]
    fn states_are_bound_to_every_argument_including_the_idempotency_key() {
        let args = |key: &str| {
            let Value::Object(m) = json!({ "import": "imp_1", "idempotency_key": key }) else {
                unreachable!()
            };
            m
        };
        let (one, two) = (
            Binding::new("tools/call", "t", &args("k1")),
            Binding::new("tools/call", "t", &args("k2")),
        );
        assert_ne!(one.digest, two.digest);
        let other_tool = Binding::new("tools/call", "u", &args("k1"));
        assert_ne!(one.digest, other_tool.digest);
        let other_method = Binding::new("prompts/get", "t", &args("k1"));
        assert_ne!(one.digest, other_method.digest);
    }

    /// A state is bound to the user and to the OAuth client it was issued through: the same
    /// user through another client (or none) is refused as if the state were forged. A
    /// state sealed without a client binds the user alone.
    #[test]
    fn states_are_bound_to_the_user_and_the_client() {
        let config = StateConfig::default();
        let keys = StateKeys::random();
        let through = |client: Option<&str>| {
            Principal::oauth(crate::principal::Grant {
                issuer: "https://as.example".into(),
                subject: "ann".into(),
                client_id: client.map(str::to_owned),
                scopes: Default::default(),
            })
        };
        let sealed_for = |who: &Principal| {
            let ask = Ask::new(caps(json!({ "elicitation": {} })), BTreeSet::new()).elicit(
                "ok",
                "OK?",
                FormSchema::new().boolean("ok", "OK", true),
            );
            seal_round(&config, &keys, Some((&binding(), who)), 0, ask)
                .unwrap()
                .1
        };
        let opens = |token: &str, who: &Principal| {
            open_round(&keys, &binding(), who, Some(token), None).is_ok()
        };
        let app = sealed_for(&through(Some("app")));
        assert!(opens(&app, &through(Some("app"))));
        assert!(!opens(&app, &through(Some("other-app"))), "another client");
        assert!(!opens(&app, &through(None)), "no client");
        let none = sealed_for(&through(None));
        assert!(opens(&none, &through(None)));
        assert!(
            opens(&none, &through(Some("app"))),
            "bound to the user alone"
        );
    }

    #[test]
    fn rounds_are_capped_and_states_carry_the_round_and_the_state() {
        let config = StateConfig {
            max_rounds: 2,
            ..StateConfig::default()
        };
        let keys = StateKeys::random();
        let who = Principal::anonymous();
        let ask = || {
            Ask::new(caps(json!({ "elicitation": {} })), BTreeSet::new())
                .elicit("x", "X?", FormSchema::new().boolean("x", "X", true))
                .state(&json!({ "step": 7 }))
        };
        let (_, token) = seal_round(&config, &keys, Some((&binding(), &who)), 1, ask()).unwrap();
        let round = open_round(&keys, &binding(), &who, Some(&token), None).unwrap();
        assert_eq!(round.number, 2);
        assert_eq!(round.state, Some(json!({ "step": 7 })));
        let e = seal_round(&config, &keys, Some((&binding(), &who)), 2, ask()).unwrap_err();
        assert!(e.message.contains("more than 2 rounds"), "{}", e.message);
    }

    #[test]
    fn answers_are_read_against_what_was_asked() {
        let config = StateConfig::default();
        let keys = StateKeys::random();
        let who = Principal::anonymous();
        let form = || FormSchema::new().integer("age", "Age", (Some(0.0), Some(150.0)), true);
        let ask = Ask::new(
            caps(json!({ "elicitation": {}, "roots": {} })),
            BTreeSet::new(),
        )
        .elicit("age", "Age?", form())
        .list_roots("roots");
        let (_, token) = seal_round(&config, &keys, Some((&binding(), &who)), 0, ask).unwrap();
        let answers = |v: Value| {
            open_round(
                &keys,
                &binding(),
                &who,
                Some(&token),
                Some(serde_json::from_value(v).unwrap()),
            )
            .unwrap()
        };
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Age {
            age: u32,
        }
        let ok = answers(json!({ "age": { "action": "accept", "content": { "age": 42 } } }));
        assert_eq!(
            ok.elicited::<Age>("age", &form()),
            Some(Elicited::Accepted(Age { age: 42 }))
        );
        // `42.0` is an integer to the form's schema, and so to the handler.
        let whole = answers(json!({ "age": { "action": "accept", "content": { "age": 42.0 } } }));
        assert_eq!(
            whole.elicited::<Age>("age", &form()),
            Some(Elicited::Accepted(Age { age: 42 }))
        );
        // Out of the asked bounds, of the wrong kind, or under a key not asked: asked again.
        let bad = answers(json!({
            "age": { "action": "accept", "content": { "age": 200 } },
            "roots": { "action": "accept" },
            "other": { "roots": [] }
        }));
        assert_eq!(bad.elicited::<Age>("age", &form()), None);
        assert_eq!(bad.roots("roots"), None);
        assert_eq!(bad.roots("other"), None);
        let declined = answers(json!({ "age": { "action": "decline" } }));
        assert_eq!(
            declined.elicited::<Age>("age", &form()),
            Some(Elicited::Declined)
        );

        // Answers sent without a state are checked against the form the handler asks.
        let stateless = |v: Value| {
            open_round(
                &keys,
                &binding(),
                &who,
                None,
                Some(serde_json::from_value(v).unwrap()),
            )
            .unwrap()
        };
        let bad = stateless(json!({ "age": { "action": "accept", "content": { "age": 200 } } }));
        assert_eq!(bad.elicited::<Age>("age", &form()), None);
        let extra = stateless(json!({
            "age": { "action": "accept", "content": { "age": 42 } },
            "unasked": { "action": "accept", "content": {} }
        }));
        assert_eq!(
            extra.elicited::<Age>("age", &form()),
            Some(Elicited::Accepted(Age { age: 42 }))
        );
    }
}

#[cfg(test)]
mod url_tests {
    use super::*;

    #[test]
    fn url_elicitation_needs_the_url_capability_and_reads_the_action() {
        let caps = |v: Value| -> ClientCapabilities { serde_json::from_value(v).unwrap() };
        let form_only = Ask::new(caps(json!({ "elicitation": {} })), BTreeSet::new()).elicit_url(
            "pay",
            "Pay here",
            "https://pay.example/123",
        );
        assert!(form_only.requests.is_empty());
        assert!(
            form_only
                .missing
                .elicitation
                .as_ref()
                .unwrap()
                .url
                .is_some()
        );

        let config = StateConfig::default();
        let keys = StateKeys::random();
        let who = Principal::anonymous();
        let binding = Binding::new("tools/call", "t", &Map::new());
        let ask = Ask::new(
            caps(json!({ "elicitation": { "url": {} } })),
            BTreeSet::new(),
        )
        .elicit_url("pay", "Pay here", "https://pay.example/123");
        let (requests, token) = seal_round(&config, &keys, Some((&binding, &who)), 0, ask).unwrap();
        let wire = serde_json::to_value(requests.unwrap()).unwrap();
        assert_eq!(wire["pay"]["method"], "elicitation/create");
        assert_eq!(wire["pay"]["params"]["mode"], "url");
        let round = open_round(
            &keys,
            &binding,
            &who,
            Some(&token),
            Some(serde_json::from_value(json!({ "pay": { "action": "accept" } })).unwrap()),
        )
        .unwrap();
        assert_eq!(round.elicited_url("pay"), Some(Elicited::Accepted(())));
        // A URL answer is not a form answer.
        assert_eq!(round.elicited::<Value>("pay", &FormSchema::new()), None);

        // What is not a URL is not sent.
        let ask = Ask::new(
            caps(json!({ "elicitation": { "url": {} } })),
            BTreeSet::new(),
        )
        .elicit_url("pay", "Pay here", "pay.example/123 now");
        let e = seal_round(&config, &keys, Some((&binding, &who)), 0, ask).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Internal);
        // Nor a sampling message holding what sampling does not take.
        let linking: CreateMessageParams = serde_json::from_value(json!({
            "messages": [{ "role": "user",
                "content": [{ "type": "text", "text": "t" },
                    { "type": "resource_link", "uri": "x://a", "name": "n" }] }],
            "maxTokens": 5
        }))
        .unwrap();
        let ask = Ask::new(caps(json!({ "sampling": {} })), BTreeSet::new()).sample("s", linking);
        let e = seal_round(&config, &keys, Some((&binding, &who)), 0, ask).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Internal);
        // Nor a tool result in one whose link is no URI (a tool result may hold links).
        let results: CreateMessageParams = serde_json::from_value(json!({
            "messages": [{ "role": "user", "content": { "type": "tool_result",
                "toolUseId": "u", "content": [
                    { "type": "resource_link", "uri": "x://a b", "name": "n" }] } }],
            "maxTokens": 5
        }))
        .unwrap();
        let ask = Ask::new(caps(json!({ "sampling": {} })), BTreeSet::new()).sample("s", results);
        let e = seal_round(&config, &keys, Some((&binding, &who)), 0, ask).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Internal);
    }

    #[test]
    fn a_form_answer_must_keep_the_formats_the_form_asked_for() {
        let form = FormSchema::new().formatted("mail", "Email", StringFormat::Email, true);
        let answer = |mail: &str| -> Round {
            let responses = json!({ "who": { "action": "accept", "content": { "mail": mail } } });
            open_round(
                &StateKeys::random(),
                &Binding::new("tools/call", "t", &Map::new()),
                &Principal::anonymous(),
                None,
                Some(serde_json::from_value(responses).unwrap()),
            )
            .unwrap()
        };
        let good = answer("ann@example.com").elicited::<Value>("who", &form);
        assert_eq!(
            good,
            Some(Elicited::Accepted(json!({ "mail": "ann@example.com" })))
        );
        assert_eq!(answer("not an email").elicited::<Value>("who", &form), None);
    }
}
