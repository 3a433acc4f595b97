//! `server/discover` and the paginated lists: served straight from the registry, without
//! copying a definition.

use serde::Serialize;
use serde::ser::SerializeMap;
use wharf_protocol::{CacheHints, CacheScope, DiscoverResult, RequestId, ResultMeta, ResultType};

use crate::cursor::ListKind;
use crate::error::RpcError;
use crate::principal::Principal;
use crate::registry::{Registry, fingerprint};
use crate::reply::respond;
use crate::runtime::Runtime;

/// What a list request asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum List {
    Tools,
    Prompts,
    Resources,
    ResourceTemplates,
}

/// `server/discover`.
pub(crate) fn discover(
    registry: &Registry,
    runtime: &Runtime,
    id: &RequestId,
) -> Result<Vec<u8>, RpcError> {
    respond(
        id,
        &DiscoverResult {
            result_type: ResultType::Complete,
            supported_versions: registry.versions.iter().map(|v| (*v).to_owned()).collect(),
            capabilities: registry.capabilities.clone(),
            instructions: registry.instructions.clone(),
            cache: Some(runtime.config.cache.discover),
            meta: runtime.result_meta(),
        },
    )
}

/// One page of `list`, from `cursor`.
pub(crate) fn page(
    registry: &Registry,
    runtime: &Runtime,
    id: &RequestId,
    list: List,
    cursor: Option<String>,
    principal: &Principal,
) -> Result<Vec<u8>, RpcError> {
    let cache = &runtime.config.cache;
    let fp = &registry.fingerprints;
    match list {
        List::Tools => {
            // Filtered per principal, the list is private to it.
            let filter = runtime.config.list_permitted_tools_only && principal.scopes().is_some();
            let items: Vec<_> = registry
                .tools
                .iter()
                .filter(|t| !filter || principal.missing_scopes(&t.def.scopes).is_empty())
                .map(|t| &t.def.tool)
                .collect();
            let (hints, fingerprint) = if filter {
                // A cursor of one grant's list is no position in another's.
                let seen = items.iter().map(|t| t.name.clone());
                let hints = CacheHints {
                    cache_scope: CacheScope::Private,
                    ..cache.tools_list
                };
                (
                    hints,
                    fingerprint(Some(fp.tools.to_string()).into_iter().chain(seen)),
                )
            } else {
                (cache.tools_list, fp.tools)
            };
            let at = Position {
                kind: ListKind::Tools,
                fingerprint,
                hints,
            };
            paginate(runtime, id, "tools", &items, cursor, at)
        }
        List::Prompts => {
            let items: Vec<_> = registry.prompts.iter().map(|p| &p.prompt).collect();
            let at = Position {
                kind: ListKind::Prompts,
                fingerprint: fp.prompts,
                hints: cache.prompts_list,
            };
            paginate(runtime, id, "prompts", &items, cursor, at)
        }
        List::Resources => {
            let items: Vec<_> = registry.resources.iter().map(|r| &r.resource).collect();
            let at = Position {
                kind: ListKind::Resources,
                fingerprint: fp.resources,
                hints: cache.resources_list,
            };
            paginate(runtime, id, "resources", &items, cursor, at)
        }
        List::ResourceTemplates => {
            let items: Vec<_> = registry.templates.iter().map(|t| &t.def.template).collect();
            let at = Position {
                kind: ListKind::ResourceTemplates,
                fingerprint: fp.templates,
                hints: cache.templates_list,
            };
            paginate(runtime, id, "resourceTemplates", &items, cursor, at)
        }
    }
}

/// Which list a cursor belongs to, and how its pages may be cached.
struct Position {
    kind: ListKind,
    /// The digest of the list's definitions: a cursor of another version is stale.
    fingerprint: u64,
    hints: CacheHints,
}

fn paginate<T: Serialize>(
    runtime: &Runtime,
    id: &RequestId,
    key: &'static str,
    items: &[&T],
    cursor: Option<String>,
    at: Position,
) -> Result<Vec<u8>, RpcError> {
    let keys = runtime.keys.get();
    let codec = &keys.cursors;
    let start = match cursor {
        Some(c) => {
            usize::try_from(codec.decode(&c, at.kind, at.fingerprint)?).unwrap_or(usize::MAX)
        }
        None => 0,
    };
    if start > items.len() {
        return Err(RpcError::invalid_params(
            "Invalid cursor: it points past the end of the list",
        ));
    }
    let end = start
        .saturating_add(runtime.config.page_size)
        .min(items.len());
    let next_cursor =
        (end < items.len()).then(|| codec.encode(at.kind, end as u64, at.fingerprint));
    respond(
        id,
        &Page {
            key,
            items: &items[start..end],
            next_cursor,
            hints: at.hints,
            meta: runtime.result_meta(),
        },
    )
}

/// One page of a list, serialized straight from the registry without copying definitions.
struct Page<'a, T> {
    key: &'static str,
    items: &'a [&'a T],
    next_cursor: Option<String>,
    hints: CacheHints,
    meta: ResultMeta,
}

impl<T: Serialize> Serialize for Page<'_, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("resultType", &ResultType::Complete)?;
        map.serialize_entry(self.key, self.items)?;
        if let Some(c) = &self.next_cursor {
            map.serialize_entry("nextCursor", c)?;
        }
        map.serialize_entry("ttlMs", &self.hints.ttl_ms)?;
        map.serialize_entry("cacheScope", &self.hints.cache_scope)?;
        map.serialize_entry("_meta", &self.meta)?;
        map.end()
    }
}
