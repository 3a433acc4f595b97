//! End-to-end tests: each starts the real `wharf serve` (or another `wharf` command) and talks
//! to it over HTTP or stdio, with real stores, browsers, SDK clients and identity providers.
//!
//! One test binary for all of them: as 22 integration-test files, each linked its own copy of
//! the server and every dependency (55 to 270 MB each). Run one area with
//! `cargo test -p wharf-cli --test e2e oauth::`.

mod common;

mod authorization_server;
mod browser_clients;
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
