//! What a user allowed a client: one record per user and client, covering every resource of
//! this server the user approved for it, each with its own scopes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use wharf::store::{Millis, now_millis};

use crate::records::digest;

/// A consent the user gave, remembered per client.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Consent {
    pub(crate) client_id: String,
    pub(crate) client_name: String,
    /// The scopes approved for `resource`, space-separated.
    pub(crate) scope: String,
    /// The resource approved last.
    pub(crate) resource: String,
    /// The scopes approved for the other resources this client was allowed (a server with
    /// several `--authz-resource`), by resource. Beside `resource` and `scope`, which
    /// replicas from before it read alone: during a rolling upgrade they see the resource
    /// approved last, as they always did.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) others: BTreeMap<String, String>,
    pub(crate) granted_at: Millis,
    /// A random id given when the user first consents, kept while the consent stands (a
    /// wider scope approved later included): the codes and token families made under it
    /// carry it, and are refused once it is withdrawn (see `account::revoke`), however long
    /// the consent record itself lives.
    #[serde(default)]
    pub(crate) id: String,
}

/// What a user approves on the consent page.
pub(crate) struct Approval<'a> {
    pub(crate) client_id: &'a str,
    pub(crate) client_name: &'a str,
    pub(crate) resource: &'a str,
    /// Space-separated.
    pub(crate) scope: &'a str,
}

impl Consent {
    /// The consent recorded once the user approved `approval`: the one `standing` widened
    /// by it, its id and every other resource it covers that the server still `serves`
    /// kept (the tokens granted under it keep their scopes, and the account page shows
    /// what the client may hold, not only what it asked for last; a resource the server no
    /// longer serves is asked for again if it comes back); a new one with id `new_id` when
    /// none stands.
    pub(crate) fn approved(
        standing: Option<Consent>,
        approval: &Approval<'_>,
        new_id: impl FnOnce() -> String,
        serves: impl Fn(&str) -> bool,
    ) -> Consent {
        let (id, mut grants) = match standing {
            Some(c) => {
                let mut grants = c.others;
                grants.insert(c.resource, c.scope);
                grants.retain(|resource, _| serves(resource));
                (c.id, grants)
            }
            None => (new_id(), BTreeMap::new()),
        };
        let before = grants.remove(approval.resource).unwrap_or_default();
        Consent {
            client_id: approval.client_id.to_owned(),
            client_name: approval.client_name.to_owned(),
            scope: widened(&before, approval.scope),
            resource: approval.resource.to_owned(),
            others: grants,
            granted_at: now_millis(),
            id,
        }
    }

    /// Whether the user approved every scope of `scope` (space-separated) for `resource`.
    pub(crate) fn covers(&self, resource: &str, scope: &str) -> bool {
        let granted = if self.resource == resource {
            Some(&self.scope)
        } else {
            self.others.get(resource)
        };
        granted
            .is_some_and(|granted| scopes(scope).all(|wanted| scopes(granted).any(|s| s == wanted)))
    }

    /// Every resource approved and its scopes, the one approved last first.
    pub(crate) fn grants(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::once((self.resource.as_str(), self.scope.as_str())).chain(
            self.others
                .iter()
                .map(|(resource, scope)| (resource.as_str(), scope.as_str())),
        )
    }
}

/// A consent's key: a digest, since a user name and a URL-shaped client id together may
/// pass the store's key length, and neither may contain the separator.
pub(crate) fn consent_key(user: &str, client_id: &str) -> String {
    digest(&format!("{}\n{user}\n{client_id}", user.len()))
}

/// The scopes of a space-separated list.
fn scopes(list: &str) -> impl Iterator<Item = &str> {
    list.split(' ').filter(|s| !s.is_empty())
}

/// The scopes of `standing`, then those of `added` it lacks, space-separated.
fn widened(standing: &str, added: &str) -> String {
    let mut all: Vec<&str> = scopes(standing).collect();
    for scope in scopes(added) {
        if !all.contains(&scope) {
            all.push(scope);
        }
    }
    all.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval<'a>(resource: &'a str, scope: &'a str) -> Approval<'a> {
        Approval {
            client_id: "https://app.example/client.json",
            client_name: "App",
            resource,
            scope,
        }
    }

    const A: &str = "https://mcp.example/a";
    const B: &str = "https://mcp.example/b";

    /// The server serves both resources.
    fn served(resource: &str) -> bool {
        [A, B].contains(&resource)
    }

    /// Approving a second resource keeps the first one's approval, and the consent's id.
    #[test]
    fn each_resource_keeps_what_was_approved_for_it() {
        let first = Consent::approved(None, &approval(A, "read"), || "id1".into(), served);
        assert!(first.covers(A, "read"));
        assert!(!first.covers(B, "read"), "another resource is not approved");
        let both = Consent::approved(Some(first), &approval(B, "write"), || "id2".into(), served);
        assert_eq!(both.id, "id1");
        assert!(both.covers(A, "read"), "the first resource stays approved");
        assert!(both.covers(B, "write"));
        assert!(!both.covers(B, "read"), "scopes stay per resource");
        assert!(!both.covers(A, "read write"));
        let widened = Consent::approved(Some(both), &approval(A, "write"), || "id3".into(), served);
        assert!(
            widened.covers(A, "read write"),
            "a wider scope adds to the standing one"
        );
        assert!(widened.covers(B, "write"));
        let grants: Vec<_> = widened.grants().collect();
        assert_eq!(grants, [(A, "read write"), (B, "write")]);
    }

    /// A record written before consents held several resources reads as one resource, and
    /// one written now reads on a replica from before: it sees the resource approved last.
    #[test]
    fn records_read_across_versions() {
        let old = r#"{"client_id":"c","client_name":"n","scope":"read","resource":"https://mcp.example/a","granted_at":1,"id":"x"}"#;
        let consent: Consent = serde_json::from_str(old).unwrap();
        assert!(consent.covers(A, "read"));
        assert_eq!(consent.grants().count(), 1);
        let both = Consent::approved(Some(consent), &approval(B, "write"), || "y".into(), served);
        let written = serde_json::to_value(&both).unwrap();
        assert_eq!(written["resource"], B);
        assert_eq!(written["scope"], "write");
        assert_eq!(written["others"][A], "read");
        let single = Consent::approved(None, &approval(A, "read"), || "z".into(), served);
        let written = serde_json::to_value(&single).unwrap();
        assert!(written.get("others").is_none(), "{written}");
        // What an earlier replica reads of a record holding two resources: the one
        // approved last (it would write the other away; the page then asks for it again).
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Earlier {
            client_id: String,
            client_name: String,
            scope: String,
            resource: String,
            granted_at: Millis,
            #[serde(default)]
            id: String,
        }
        let earlier: Earlier =
            serde_json::from_value(serde_json::to_value(&both).unwrap()).unwrap();
        assert_eq!(
            (earlier.resource.as_str(), earlier.scope.as_str()),
            (B, "write")
        );
        assert_eq!(earlier.id, "x");
    }

    /// A resource the server no longer serves is dropped at the next approval: the account
    /// page stops listing it, and it is asked for again if it comes back.
    #[test]
    fn a_resource_no_longer_served_is_forgotten() {
        let both = Consent::approved(None, &approval(A, "read"), || "id".into(), served);
        let both = Consent::approved(Some(both), &approval(B, "read"), || "x".into(), served);
        let only_b = |resource: &str| resource == B;
        let after = Consent::approved(Some(both), &approval(B, "write"), || "y".into(), only_b);
        assert!(!after.covers(A, "read"));
        assert!(after.covers(B, "read write"));
        assert_eq!(after.grants().count(), 1);
    }

    #[test]
    fn an_empty_scope_is_covered_by_any_approval_of_its_resource() {
        let consent = Consent::approved(None, &approval(A, ""), || "id".into(), served);
        assert!(consent.covers(A, ""));
        assert!(!consent.covers(B, ""));
    }
}
