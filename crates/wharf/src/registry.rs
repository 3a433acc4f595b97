//! Every definition of a server, checked and compiled once when it is built, and the
//! lookups requests make in them (template matching lives here and nowhere else).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use wharf_protocol::{
    Icon, JsonObject, ListCapability, ResourcesCapability, ServerCapabilities, meta, version,
};

use crate::handle_args;
pub(crate) use crate::handle_args::HandleParam;
use crate::prompt::PromptDef;
use crate::resource::{CompiledTemplate, ResourceDef, TemplateDef};
use crate::schema::{self, HeaderParam};
use crate::tool::{Idempotence, ToolDef};
use crate::uri_template::{self, Vars};

/// What a server is built from.
pub(crate) struct Definitions {
    pub(crate) instructions: Option<String>,
    pub(crate) tools: Vec<ToolDef>,
    pub(crate) prompts: Vec<PromptDef>,
    pub(crate) resources: Vec<ResourceDef>,
    pub(crate) templates: Vec<TemplateDef>,
    /// Whether the server has a store (handles and idempotent tools need one).
    pub(crate) has_store: bool,
    /// The store's [`Store::step_claims`](crate::store::Store::step_claims).
    pub(crate) step_claims: Option<usize>,
    /// Whether to declare the `logging` capability.
    pub(crate) logging: bool,
    /// Whether the server opens sessions for clients of the `initialize` era.
    pub(crate) legacy: bool,
    /// The extensions the server declares, by name, with their settings.
    pub(crate) extensions: BTreeMap<String, JsonObject>,
}

/// Why a server could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A tool name outside the allowed characters or length.
    #[error("tool {0:?}: the name must be 1 to 128 characters of A-Z, a-z, 0-9, '_', '-' and '.'")]
    ToolName(String),
    /// Two definitions of one kind share a name (or a URI).
    #[error("{kind} {name:?} is registered twice")]
    Duplicate {
        /// What kind of definition.
        kind: &'static str,
        /// The shared name.
        name: String,
    },
    #[error("tool {tool:?}: inputSchema must be a JSON Schema object with \"type\": \"object\"")]
    /// A tool whose input schema is not an object schema.
    InputNotObject {
        /// The tool.
        tool: String,
    },
    /// A schema that does not compile.
    #[error("tool {tool:?}: invalid {which}: {reason}")]
    Schema {
        /// The tool.
        tool: String,
        /// Which schema.
        which: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An invalid `x-mcp-header` argument.
    #[error("tool {tool:?}: invalid x-mcp-header: {reason}")]
    HeaderParam {
        /// The tool.
        tool: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A scope that is not an RFC 6749 §3.3 scope token: it could not be named in a
    /// `WWW-Authenticate` challenge.
    #[error(
        "{kind} {name:?}: scope {scope:?} is not a valid scope: use printable ASCII without spaces, '\"' or '\\' (RFC 6749 §3.3)"
    )]
    Scope {
        /// What kind of definition.
        kind: &'static str,
        /// Its name (or URI).
        name: String,
        /// The scope.
        scope: String,
    },
    /// A resource URI that is not a URI (see [`is_uri`](crate::is_uri)).
    #[error("resource {uri:?}: not a URI (RFC 3986): {problem}")]
    ResourceUri {
        /// The URI.
        uri: String,
        /// Where the parser stopped.
        problem: String,
    },
    /// A link the server's identity, a tool, prompt, resource or template gives
    /// (`websiteUrl`, an icon's `src`) that is not a URI (RFC 3986).
    #[error("{what}: {uri:?} is not a URI (RFC 3986)")]
    NotAUri {
        /// Whose link it is.
        what: String,
        /// The link.
        uri: String,
    },
    /// An invalid URI template, or scopes of a template that cannot stand.
    #[error("resource template {uri:?}: {reason}")]
    Template {
        /// The template.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    #[error(
        "tool {tool:?} takes handles or is idempotent, which needs a store: call ServerBuilder::store"
    )]
    /// A tool that needs a store on a server without one.
    NeedsStore {
        /// The tool.
        tool: String,
    },
    #[error(
        "tool {tool:?} mutates the value of {argument:?}, which must be a required string property of its inputSchema"
    )]
    /// A `mutates` argument that is not a required string.
    MutatesArgument {
        /// The tool.
        tool: String,
        /// The argument it names.
        argument: String,
    },
    #[error(
        "tool {tool:?} writes in steps, which this store cannot run: its pool has too few connections to hold a call's claim on one while the steps take others (PostgreSQL needs at least 3, one being the change bus's listener)"
    )]
    /// A write in steps on a store whose pool is too small to run one.
    StepsNeedConnections {
        /// The tool.
        tool: String,
    },
    /// A page size of 0.
    #[error("page size must be at least 1")]
    PageSize,
    /// A `_meta` key of a definition that is not written as the specification says, or an
    /// extension's name that is not such a key.
    #[error(
        "{whose}: {key:?} is not a _meta key (an optional prefix like \"com.example/\", then a name of letters, digits, '-', '_' and '.', beginning and ending with a letter or digit)"
    )]
    MetaKey {
        /// Whose key it is.
        whose: String,
        /// The key.
        key: String,
    },
    /// A cap of 0 (nothing under it would ever run) or beyond what a cap can count.
    #[error("{what} is {value}: a cap must be from 1 to {max}")]
    Cap {
        /// Which cap.
        what: String,
        /// Its value.
        value: usize,
        /// The largest a cap can be.
        max: usize,
    },
    /// Idempotency records kept no longer than a call may run (checked when the server has a
    /// store): a retry could find the first attempt's claim expired while that attempt still
    /// ran, and run the write again.
    #[error(
        "idempotency_retention ({retention:?}) must be longer than max_call_duration ({call:?}): a write's record must outlive the call that writes it"
    )]
    Retention {
        /// The configured retention.
        retention: std::time::Duration,
        /// The configured longest call.
        call: std::time::Duration,
    },
}

pub(crate) struct ToolEntry {
    pub(crate) def: ToolDef,
    /// The tool's own cap on calls at once.
    pub(crate) limit: Option<Arc<tokio::sync::Semaphore>>,
    pub(crate) handles: Vec<HandleParam>,
    pub(crate) input: Option<jsonschema::Validator>,
    pub(crate) output: Option<jsonschema::Validator>,
    pub(crate) header_params: Vec<HeaderParam>,
}

impl ToolEntry {
    /// How long a call of this tool may run: its own limit, never beyond the server's.
    pub(crate) fn time_limit(&self, server_max: std::time::Duration) -> std::time::Duration {
        self.def.timeout.map_or(server_max, |t| t.min(server_max))
    }
}

#[derive(Default)]
pub(crate) struct Fingerprints {
    pub(crate) tools: u64,
    pub(crate) prompts: u64,
    pub(crate) resources: u64,
    pub(crate) templates: u64,
}

/// Names to positions. Built once from the server's own definitions and only read after,
/// so a request's name cannot grow a collision chain: a fast hash is enough, and every
/// tool call looks its name up more than once.
type Index = HashMap<String, usize, foldhash::fast::RandomState>;

/// The definitions of a built server, indexed.
pub(crate) struct Registry {
    pub(crate) instructions: Option<String>,
    pub(crate) capabilities: ServerCapabilities,
    pub(crate) tools: Vec<ToolEntry>,
    tool_index: Index,
    pub(crate) prompts: Vec<PromptDef>,
    prompt_index: Index,
    pub(crate) resources: Vec<ResourceDef>,
    resource_index: Index,
    pub(crate) templates: Vec<CompiledTemplate>,
    pub(crate) fingerprints: Fingerprints,
    /// Every fixed scope a definition declares, sorted, each once.
    pub(crate) scopes: Vec<String>,
    /// The revisions the server speaks, as `-32022` and `server/discover` list them.
    pub(crate) versions: &'static [&'static str],
}

/// What a resource URI resolves to.
pub(crate) enum ResourceTarget<'a> {
    /// A static resource.
    Static(&'a ResourceDef),
    /// A resource of a template, with the variables its URI matched.
    Template(&'a CompiledTemplate, Vars),
}

impl ResourceTarget<'_> {
    /// The scopes a read of this resource needs.
    pub(crate) fn scopes(&self) -> Cow<'_, [String]> {
        match self {
            ResourceTarget::Static(r) => Cow::Borrowed(r.scopes.as_slice()),
            ResourceTarget::Template(t, vars) => t.scopes_for(vars),
        }
    }
}

/// Refuses icons whose `src` is not a URI: a client would get a list no schema accepts.
/// `whose` names what they belong to.
pub(crate) fn icons_are_uris(
    icons: &Option<Vec<Icon>>,
    whose: impl FnOnce() -> String,
) -> Result<(), BuildError> {
    match icons
        .iter()
        .flatten()
        .find(|i| !uri_template::is_uri(&i.src))
    {
        Some(icon) => Err(BuildError::NotAUri {
            what: format!("{}: an icon's src", whose()),
            uri: icon.src.clone(),
        }),
        None => Ok(()),
    }
}

/// Refuses `_meta` keys not written as the specification writes them (see
/// [`is_meta_key`](wharf_protocol::meta::is_meta_key)). `whose` names what they belong to.
fn meta_keys(meta: &Option<JsonObject>, whose: impl FnOnce() -> String) -> Result<(), BuildError> {
    match meta
        .iter()
        .flat_map(|m| m.keys())
        .find(|k| !meta::is_meta_key(k))
    {
        Some(key) => Err(BuildError::MetaKey {
            whose: whose(),
            key: key.clone(),
        }),
        None => Ok(()),
    }
}

/// Refuses a cap of 0 and one beyond what a semaphore counts (tokio's `Semaphore::new`
/// panics past it). `what` names the cap.
pub(crate) fn check_cap(value: usize, what: impl FnOnce() -> String) -> Result<(), BuildError> {
    let max = tokio::sync::Semaphore::MAX_PERMITS;
    if (1..=max).contains(&value) {
        return Ok(());
    }
    Err(BuildError::Cap {
        what: what(),
        value,
        max,
    })
}

/// Whether `scope` is one RFC 6749 §3.3 scope token: `1*( %x21 / %x23-5B / %x5D-7E )`.
fn is_scope_token(scope: &str) -> bool {
    !scope.is_empty()
        && scope
            .bytes()
            .all(|b| matches!(b, 0x21 | 0x23..=0x5B | 0x5D..=0x7E))
}

impl Registry {
    /// Checks every definition and compiles every schema, once.
    pub(crate) fn build(defs: Definitions) -> Result<Registry, BuildError> {
        let mut tools = Vec::with_capacity(defs.tools.len());
        let mut tool_index = Index::default();
        for mut def in defs.tools {
            schema::objects_for_booleans(&mut def.tool.input_schema);
            if let Some(output) = &mut def.tool.output_schema {
                schema::objects_for_booleans(output);
            }
            let name = def.tool.name.clone();
            let valid_name = (1..=128).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
            if !valid_name {
                return Err(BuildError::ToolName(name));
            }
            icons_are_uris(&def.tool.icons, || format!("tool {name:?}"))?;
            meta_keys(&def.tool.meta, || format!("tool {name:?}"))?;
            if def.tool.input_schema.get("type").and_then(|t| t.as_str()) != Some("object") {
                return Err(BuildError::InputNotObject { tool: name });
            }
            let input = schema::compile_input(&def.tool.input_schema).map_err(|reason| {
                BuildError::Schema {
                    tool: name.clone(),
                    which: "inputSchema",
                    reason,
                }
            })?;
            // Always compiled, even when it accepts any object: a result must still be one
            // (and be there at all).
            let output = match &def.tool.output_schema {
                Some(s) => Some(schema::compile(s).map_err(|reason| BuildError::Schema {
                    tool: name.clone(),
                    which: "outputSchema",
                    reason,
                })?),
                None => None,
            };
            let header_params =
                schema::header_params(&def.tool.input_schema).map_err(|reason| {
                    BuildError::HeaderParam {
                        tool: name.clone(),
                        reason,
                    }
                })?;
            let handles =
                handle_args::find(&def.tool.input_schema).map_err(|reason| BuildError::Schema {
                    tool: name.clone(),
                    which: "inputSchema",
                    reason,
                })?;
            if (def.idempotent.is_some() || !handles.is_empty()) && !defs.has_store {
                return Err(BuildError::NeedsStore { tool: name });
            }
            if def.idempotent == Some(Idempotence::InSteps) && defs.step_claims == Some(0) {
                return Err(BuildError::StepsNeedConnections { tool: name });
            }
            if let Some(argument) = &def.mutates {
                if !required_string(&def.tool.input_schema, argument) {
                    return Err(BuildError::MutatesArgument {
                        tool: name,
                        argument: argument.clone(),
                    });
                }
            }
            if tool_index.insert(name.clone(), tools.len()).is_some() {
                return Err(BuildError::Duplicate { kind: "tool", name });
            }
            if let Some(n) = def.max_concurrency {
                check_cap(n, || format!("tool {name:?}: max_concurrency"))?;
            }
            let limit = def
                .max_concurrency
                .map(|n| Arc::new(tokio::sync::Semaphore::new(n)));
            tools.push(ToolEntry {
                def,
                limit,
                handles,
                input,
                output,
                header_params,
            });
        }
        let mut prompt_index = Index::default();
        for (i, p) in defs.prompts.iter().enumerate() {
            let whose = || format!("prompt {:?}", p.prompt.name);
            icons_are_uris(&p.prompt.icons, whose)?;
            meta_keys(&p.prompt.meta, whose)?;
            if prompt_index.insert(p.prompt.name.clone(), i).is_some() {
                return Err(BuildError::Duplicate {
                    kind: "prompt",
                    name: p.prompt.name.clone(),
                });
            }
        }
        let mut resource_index = Index::default();
        for (i, r) in defs.resources.iter().enumerate() {
            if let Some(problem) = uri_template::uri_problem(&r.resource.uri) {
                return Err(BuildError::ResourceUri {
                    uri: r.resource.uri.clone(),
                    problem,
                });
            }
            let whose = || format!("resource {:?}", r.resource.uri);
            icons_are_uris(&r.resource.icons, whose)?;
            meta_keys(&r.resource.meta, whose)?;
            let uri = uri_template::normalized(&r.resource.uri).into_owned();
            if resource_index.insert(uri, i).is_some() {
                return Err(BuildError::Duplicate {
                    kind: "resource",
                    name: r.resource.uri.clone(),
                });
            }
        }
        let mut templates = Vec::with_capacity(defs.templates.len());
        for def in defs.templates {
            let uri = def.template.uri_template.clone();
            let whose = || format!("resource template {uri:?}");
            icons_are_uris(&def.template.icons, whose)?;
            meta_keys(&def.template.meta, whose)?;
            let compiled = CompiledTemplate::new(def).map_err(|reason| BuildError::Template {
                uri: uri.clone(),
                reason,
            })?;
            if templates
                .iter()
                .any(|t: &CompiledTemplate| t.parsed == compiled.parsed)
            {
                return Err(BuildError::Duplicate {
                    kind: "resource template",
                    name: uri,
                });
            }
            templates.push(compiled);
        }
        // Refusals quote the scopes a request needs in a challenge header: one outside the
        // grammar would break it.
        let declared = tools
            .iter()
            .map(|t| ("tool", &t.def.tool.name, &t.def.scopes))
            .chain(
                defs.prompts
                    .iter()
                    .map(|p| ("prompt", &p.prompt.name, &p.scopes)),
            )
            .chain(
                defs.resources
                    .iter()
                    .map(|r| ("resource", &r.resource.uri, &r.scopes)),
            )
            .chain(templates.iter().map(|t| {
                let uri = &t.def.template.uri_template;
                ("resource template", uri, &t.def.scopes)
            }));
        for (kind, name, scopes) in declared {
            if let Some(bad) = scopes.iter().find(|s| !is_scope_token(s)) {
                return Err(BuildError::Scope {
                    kind,
                    name: name.clone(),
                    scope: bad.clone(),
                });
            }
        }
        let fixed: Vec<&str> = tools
            .iter()
            .flat_map(|t| &t.def.scopes)
            .chain(defs.prompts.iter().flat_map(|p| &p.scopes))
            .chain(defs.resources.iter().flat_map(|r| &r.scopes))
            .chain(
                templates
                    .iter()
                    .flat_map(|t| &t.def.scopes)
                    .filter(|s| !s.contains('{')),
            )
            .map(String::as_str)
            .collect();
        let mut scopes: Vec<String> = fixed.iter().map(|s| (*s).to_owned()).collect();
        scopes.sort_unstable();
        scopes.dedup();
        for t in &templates {
            if let Some((scope, fixed)) = t.collision(fixed.iter().copied()) {
                return Err(BuildError::Template {
                    uri: t.def.template.uri_template.clone(),
                    reason: format!(
                        "scope {scope:?} can expand to {fixed:?}, a fixed scope of this server: \
                     a token granted {fixed:?} would read those resources; give the variable \
                     scope a prefix of its own"
                    ),
                });
            }
        }

        if let Some(name) = defs
            .extensions
            .keys()
            .find(|name| !name.contains('/') || !meta::is_meta_key(name))
        {
            return Err(BuildError::MetaKey {
                whose: "an extension's name (a prefix is required)".to_owned(),
                key: name.clone(),
            });
        }
        let listed = Some(true);
        let capabilities = ServerCapabilities {
            tools: (!tools.is_empty()).then_some(ListCapability {
                list_changed: listed,
            }),
            prompts: (!defs.prompts.is_empty()).then_some(ListCapability {
                list_changed: listed,
            }),
            resources: (!defs.resources.is_empty() || !templates.is_empty()).then_some(
                ResourcesCapability {
                    list_changed: listed,
                    subscribe: Some(true),
                },
            ),
            completions: (defs.prompts.iter().any(|p| p.complete.is_some())
                || templates.iter().any(|t| t.def.complete.is_some())
                || !defs.prompts.is_empty())
            .then(JsonObject::new),
            logging: defs.logging.then(JsonObject::new),
            experimental: None,
            extensions: (!defs.extensions.is_empty()).then_some(defs.extensions),
        };
        let fingerprints = Fingerprints {
            tools: fingerprint(
                tools
                    .iter()
                    .map(|t| serde_json::to_string(&t.def.tool).unwrap_or_default()),
            ),
            prompts: fingerprint(
                defs.prompts
                    .iter()
                    .map(|p| serde_json::to_string(&p.prompt).unwrap_or_default()),
            ),
            resources: fingerprint(
                defs.resources
                    .iter()
                    .map(|r| serde_json::to_string(&r.resource).unwrap_or_default()),
            ),
            templates: fingerprint(
                templates
                    .iter()
                    .map(|t| serde_json::to_string(&t.def.template).unwrap_or_default()),
            ),
        };
        Ok(Registry {
            instructions: defs.instructions,
            capabilities,
            tools,
            tool_index,
            prompts: defs.prompts,
            prompt_index,
            resources: defs.resources,
            resource_index,
            templates,
            fingerprints,
            scopes,
            versions: if defs.legacy {
                version::DUAL_ERA
            } else {
                version::SUPPORTED
            },
        })
    }

    /// The tool called `name`.
    pub(crate) fn tool(&self, name: &str) -> Option<&ToolEntry> {
        self.tool_index.get(name).map(|&i| &self.tools[i])
    }

    /// Where tool `name` is in [`Registry::tools`].
    pub(crate) fn tool_position(&self, name: &str) -> Option<usize> {
        self.tool_index.get(name).copied()
    }

    /// The prompt called `name`.
    pub(crate) fn prompt(&self, name: &str) -> Option<&PromptDef> {
        self.prompt_index.get(name).map(|&i| &self.prompts[i])
    }

    /// What serves `uri`: a static resource first, then the most specific template that
    /// matches (the most literal characters; the first registered among equals). `uri` is
    /// compared normalized: `config://app/secr%65ts` is `config://app/secrets`, whose
    /// resource (and scopes) it must reach, not a template's.
    pub(crate) fn resource(&self, uri: &str) -> Option<ResourceTarget<'_>> {
        let uri = uri_template::normalized(uri);
        if let Some(&i) = self.resource_index.get(uri.as_ref()) {
            return Some(ResourceTarget::Static(&self.resources[i]));
        }
        let mut best: Option<(&CompiledTemplate, Vars)> = None;
        for t in &self.templates {
            if best
                .as_ref()
                .is_some_and(|(b, _)| b.parsed.literal_len() >= t.parsed.literal_len())
            {
                continue;
            }
            if let Some(vars) = t.parsed.match_uri(&uri) {
                best = Some((t, vars));
            }
        }
        best.map(|(t, vars)| ResourceTarget::Template(t, vars))
    }

    /// The template whose URI template is `uri_template` (what a completion refers to).
    pub(crate) fn template(&self, uri_template: &str) -> Option<&CompiledTemplate> {
        self.templates
            .iter()
            .find(|t| t.def.template.uri_template == uri_template)
    }

    /// Whether `uri` names a static resource (not a template's).
    pub(crate) fn is_static_resource(&self, uri: &str) -> bool {
        self.resource_index
            .contains_key(uri_template::normalized(uri).as_ref())
    }
}

/// A stable digest of a list's definitions: cursors issued for another version of the list
/// are refused as stale. Uses a fixed hasher so every replica computes the same value.
pub(crate) fn fingerprint(items: impl Iterator<Item = String>) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for item in items {
        h.update(item.as_bytes());
        h.update([0]);
    }
    let out = h.finalize();
    let mut word = [0u8; 8];
    word.copy_from_slice(&out[..8]);
    u64::from_be_bytes(word)
}

/// Whether `name` is a required property of `input` whose schema says it is a string.
fn required_string(input: &JsonObject, name: &str) -> bool {
    let required = input
        .get("required")
        .and_then(|r| r.as_array())
        .is_some_and(|r| r.iter().any(|v| v == name));
    let string = input
        .get("properties")
        .and_then(|p| p.get(name))
        .and_then(|p| p.get("type"))
        .is_some_and(|t| t == "string");
    required && string
}
