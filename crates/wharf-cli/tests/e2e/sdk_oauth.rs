//! A real MCP client's OAuth support against `wharf serve --authorization-server`: the Python
//! SDK 2.3's `OAuthClientProvider` (tests/python/sdk_oauth_client.py) discovers the server's
//! authorization server, identifies with a Client ID Metadata Document served by this test
//! (or registers, RFC 7591), and runs authorization code + PKCE while headless Chromium plays
//! the person on the sign-in and consent pages; then it lists and calls a tool.

use crate::common;

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::ServerProcess;
use common::authz::{PASSWORD, own_server};
use common::chromium::{browser, callback, sign_in_and_allow, wait_for_url};
use common::documents::{Answer, document_server};
use common::import::{sqlite_url, unique};
use common::peers::venv_python;
use fantoccini::Locator;
use serde_json::{Value, json};

/// The Python SDK client, talking line by line.
struct SdkClient {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Drop for SdkClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SdkClient {
    fn start(url: &str, redirect: &str, client_metadata_url: Option<&str>) -> Self {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/python/sdk_oauth_client.py"
        );
        let mut command = Command::new(venv_python("pyvenv"));
        command.args([script, url, redirect, "add", r#"{"a": 2, "b": 40}"#]);
        if let Some(cimd) = client_metadata_url {
            command.args(["--client-metadata-url", cimd]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the Python SDK client");
        let stdin = child.stdin.take().unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("sdk client: {line}");
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// The payload of the next line tagged `tag`; a FAILED line fails the test.
    fn expect(&self, tag: &str) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("the SDK client said nothing more (waiting for {tag})"));
            if let Some(rest) = line.strip_prefix(&format!("{tag} ")) {
                return rest.to_owned();
            }
            assert!(!line.starts_with("FAILED"), "{line}");
        }
    }
}

/// Runs the SDK client through the flow; returns what `tools/list` and the call answered.
async fn run_flow(
    server: &ServerProcess,
    client_metadata_url: Option<&str>,
    redirect: &str,
) -> (Value, Value) {
    let sdk = SdkClient::start(&server.url(), redirect, client_metadata_url);
    let authorize = sdk.expect("AUTHORIZE");
    let (_driver, chromium) = browser().await;
    chromium.goto(&authorize).await.unwrap();
    sign_in_and_allow(&chromium, "alice", PASSWORD).await;
    let landed = wait_for_url(&chromium, redirect).await;
    let mut stdin = &sdk.stdin;
    writeln!(stdin, "{landed}").unwrap();
    stdin.flush().unwrap();
    let tools: Value = serde_json::from_str(&sdk.expect("TOOLS")).unwrap();
    let result: Value = serde_json::from_str(&sdk.expect("RESULT")).unwrap();
    chromium.close().await.unwrap();
    (tools, result)
}

fn assert_called(tools: &Value, result: &Value) {
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"add"), "{names:?}");
    assert_eq!(result["structuredContent"], json!({"sum": 42}), "{result}");
}

#[tokio::test]
async fn the_python_sdk_signs_in_with_a_client_id_metadata_document() {
    let (docs, ca) = document_server().await;
    let server = own_server(
        "sdk-cimd",
        "demo",
        &[
            "--authz-closed-registration",
            "--authz-allow-loopback-documents",
            "--authz-document-root-cert",
            ca.to_str().unwrap(),
        ],
    );
    let redirect = callback();
    let path = "python-sdk.json";
    docs.set(
        path,
        Answer::Json {
            body: docs.document(
                path,
                json!({"client_name": "Python SDK test client", "redirect_uris": [redirect]}),
            ),
            cache: "max-age=60",
        },
    );
    let (tools, result) = run_flow(&server, Some(&docs.url(path)), &redirect).await;
    assert_called(&tools, &result);
    assert!(
        docs.hits(path) >= 1,
        "the server fetched the client's document"
    );
}

#[tokio::test]
async fn the_python_sdk_signs_in_after_registering() {
    let server = own_server("sdk-dcr", "demo", &[]);
    let redirect = callback();
    let (tools, result) = run_flow(&server, None, &redirect).await;
    assert_called(&tools, &result);
}

/// `oidc-provider` (npm), killed when dropped.
struct OpenIdProvider(Child);

impl Drop for OpenIdProvider {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the upstream provider with one client, Wharf, redirecting to `redirect`.
fn open_id_provider(client_secret: &str, redirect: &str) -> (OpenIdProvider, String) {
    let module = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../target/node-oidc/node_modules/oidc-provider"
    );
    assert!(
        std::path::Path::new(module).exists(),
        "{module} is required: scripts/test.sh installs oidc-provider there"
    );
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/node/oidc_provider.mjs"
    );
    let port = common::free_port().to_string();
    let mut child = Command::new("node")
        .args([script, module, &port, "wharf", client_secret, redirect])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node is required to run oidc-provider");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut ready = String::new();
    out.read_line(&mut ready).unwrap();
    // Keep reading what it prints, so it never writes into a closed pipe.
    std::thread::spawn(move || out.lines().for_each(drop));
    let issuer = ready
        .trim()
        .strip_prefix("READY ")
        .unwrap_or_else(|| panic!("oidc-provider: {ready}"))
        .to_owned();
    (OpenIdProvider(child), issuer)
}

#[tokio::test]
async fn the_python_sdk_signs_in_a_person_of_an_upstream_openid_provider() {
    let store = sqlite_url(&unique("sdk-upstream"));
    let port = common::free_port();
    let secret = unique("upstream-secret");
    let (_provider, issuer) = open_id_provider(
        &secret,
        &format!("http://127.0.0.1:{port}/authorize/upstream/callback"),
    );
    let server = ServerProcess::start_on(
        port,
        &[
            "--profile",
            "demo",
            "--store",
            &store,
            "--authorization-server",
            "--authz-upstream-issuer",
            &issuer,
            "--authz-upstream-client-id",
            "wharf",
            "--authz-upstream-client-secret",
            &secret,
            "--authz-upstream-name",
            "Harbor",
        ],
    );
    let redirect = callback();
    let sdk = SdkClient::start(&server.url(), &redirect, None);
    let authorize = sdk.expect("AUTHORIZE");
    let (_driver, chromium) = browser().await;
    chromium.goto(&authorize).await.unwrap();
    // Wharf's sign-in page offers the provider; the provider's own pages sign "bob" in.
    let upstream = chromium
        .wait()
        .for_element(Locator::Id("upstream"))
        .await
        .unwrap();
    assert_eq!(upstream.text().await.unwrap(), "Sign in with Harbor");
    upstream.click().await.unwrap();
    let login = chromium
        .wait()
        .for_element(Locator::Css("input[name=login]"))
        .await
        .unwrap();
    login.send_keys("bob").await.unwrap();
    let password = chromium
        .find(Locator::Css("input[name=password]"))
        .await
        .unwrap();
    password.send_keys("any password").await.unwrap();
    chromium
        .find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The provider asks its own consent, then sends the person back to Wharf's.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let approve = loop {
        if let Ok(approve) = chromium.find(Locator::Id("approve")).await {
            break approve;
        }
        if let Ok(button) = chromium.find(Locator::Css("button[type=submit]")).await {
            let _ = button.click().await;
        }
        if std::time::Instant::now() > deadline {
            let url = chromium.current_url().await.unwrap();
            let page = chromium.source().await.unwrap();
            panic!("never reached Wharf's consent page; at {url}:\n{page}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let page = chromium.source().await.unwrap();
    assert!(
        page.contains("Harbor:bob"),
        "signed in as the provider's user: {page}"
    );
    approve.click().await.unwrap();
    let landed = wait_for_url(&chromium, &redirect).await;
    let mut stdin = &sdk.stdin;
    writeln!(stdin, "{landed}").unwrap();
    let tools: Value = serde_json::from_str(&sdk.expect("TOOLS")).unwrap();
    let result: Value = serde_json::from_str(&sdk.expect("RESULT")).unwrap();
    assert_called(&tools, &result);
    chromium.close().await.unwrap();
}
