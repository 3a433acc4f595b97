//! End-to-end tests: each starts the real `wharf serve` (or another `wharf` command) and talks
//! to it over HTTP or stdio, with real stores, browsers, SDK clients and identity providers.
//!
//! One test binary for all of them: every integration-test file would otherwise link its own
//! copy of the whole server and its dependencies, and that linking was most of what the tests
//! cost to build. Run one area with `cargo test -p wharf-cli --test e2e oauth::`.

mod common;

mod authorization_server;
mod client_metadata_documents;
mod command;
mod connections;
mod consent_in_a_browser;
mod deploy;
mod exactly_once;
mod hostile;
mod http_bad_input;
mod http_features;
mod import;
mod legacy;
mod limits;
mod mrtr;
mod oauth;
mod observability;
mod operations;
mod replicas;
mod reports;
mod scope_challenge;
mod sdk_oauth;
mod stdio;
