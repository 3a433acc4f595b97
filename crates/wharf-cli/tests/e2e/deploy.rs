//! The files in `deploy/`, exercised for real: nginx (Debian's package) in front of three
//! `wharf serve` replicas started as the systemd unit and `deploy/wharf.env` start them, on
//! PostgreSQL or Redis. Clients talk to nginx only and never know which replica answers.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::import::*;
use common::{ServerProcess, free_port, validate_message};
use futures_util::StreamExt;
use serde_json::{Value, json};
use wharf_client::HttpClient;

fn deploy_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(name)
}

/// `KEY=VALUE` lines, as systemd reads an environment file or `Environment=` settings.
fn assignments<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<(String, String)> {
    lines
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=VALUE");
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// The environment the unit and `deploy/wharf.env` give every replica, as systemd puts
/// them together (the file's settings over the unit's), with the test's store in place of
/// the example's and `credentials` as the unit's credentials directory (`%d`).
fn replica_env(store: &str, credentials: &Path) -> Vec<(String, String)> {
    let unit = std::fs::read_to_string(deploy_file("systemd/wharf@.service")).unwrap();
    let file = std::fs::read_to_string(deploy_file("wharf.env")).unwrap();
    let from_unit = assignments(unit.lines().filter_map(|l| l.strip_prefix("Environment=")));
    let from_file = assignments(file.lines());
    for (key, _) in &from_file {
        assert!(
            from_unit.iter().all(|(k, _)| k != key),
            "deploy/wharf.env would override the unit's {key}"
        );
    }
    let mut env: Vec<(String, String)> = from_unit
        .into_iter()
        .map(|(k, v)| (k, v.replace("%d", &credentials.display().to_string())))
        .chain(from_file)
        .collect();
    env.iter_mut()
        .find(|(k, _)| k == "WHARF_STORE")
        .expect("deploy/wharf.env sets WHARF_STORE")
        .1 = store.to_owned();
    env
}

/// The unit starts `wharf serve` on 127.0.0.1:INSTANCE with the environment file and the
/// API keys as a credential (the name `replica_env` finds them under), and gives the drain
/// the time it needs before systemd kills the process.
fn check_unit(env: &[(String, String)]) {
    let unit = std::fs::read_to_string(deploy_file("systemd/wharf@.service")).unwrap();
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("the unit sets {key}"))
            .to_owned()
    };
    assert_eq!(
        value("ExecStart"),
        "/usr/local/bin/wharf serve --listen 127.0.0.1:%i"
    );
    assert_eq!(value("LoadCredential"), "api-keys:/etc/wharf/api-keys");
    assert_eq!(value("EnvironmentFile"), "/etc/wharf/wharf.env");
    assert_eq!(value("KillSignal"), "SIGTERM");
    let secs = |key: &str| -> u64 {
        env.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.parse().unwrap())
            .unwrap()
    };
    let stop: u64 = value("TimeoutStopSec").parse().unwrap();
    assert!(
        stop > secs("WHARF_DRAIN_GRACE_SECS") + secs("WHARF_DRAIN_SECS"),
        "systemd must not kill a replica that is still draining"
    );
    let nginx = std::fs::read_to_string(deploy_file("nginx/wharf.conf")).unwrap();
    let keepalive: u64 = nginx
        .lines()
        .find_map(|l| l.trim().strip_prefix("keepalive_timeout "))
        .and_then(|v| v.strip_suffix("s;"))
        .expect("the upstream sets keepalive_timeout in seconds")
        .parse()
        .unwrap();
    assert!(
        keepalive < secs("WHARF_DRAIN_GRACE_SECS"),
        "nginx must drop idle connections before a draining replica closes them"
    );
}

/// Three replicas and nginx in front of them.
struct Fleet {
    replicas: Vec<ServerProcess>,
    ports: Vec<u16>,
    env: Vec<(String, String)>,
    nginx: Nginx,
    _dir: TempDir,
}

impl Fleet {
    /// Starts the fleet on `store`, with `overrides` of the shipped environment and `edits`
    /// of the shipped nginx configuration.
    fn start(store: &str, overrides: &[(&str, &str)], nginx_edits: &[(&str, &str)]) -> Fleet {
        let dir = TempDir::new("fleet");
        // The credentials directory systemd would make, with the keys under the unit's name.
        let credentials = dir.0.join("credentials");
        std::fs::create_dir_all(&credentials).unwrap();
        let keys = format!("user-42={TOKEN_42}\nuser-7={TOKEN_7}\n");
        std::fs::write(credentials.join("api-keys"), keys).unwrap();
        let mut env = replica_env(store, &credentials);
        check_unit(&env);
        for (key, value) in overrides {
            env.retain(|(k, _)| k != key);
            env.push(((*key).to_owned(), (*value).to_owned()));
        }
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let replicas = ports.iter().map(|&p| replica(p, &env)).collect();
        let nginx = Nginx::start(&dir.0, &ports, nginx_edits);
        Fleet {
            replicas,
            ports,
            env,
            nginx,
            _dir: dir,
        }
    }

    /// The MCP endpoint's URL, through nginx over TLS.
    fn url(&self) -> String {
        format!("https://localhost:{}/mcp", self.nginx.port)
    }

    /// An HTTP client that trusts nginx's certificate.
    fn http(&self) -> reqwest::Client {
        let ca = std::fs::read(&self.nginx.ca).unwrap();
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .build()
            .unwrap()
    }

    /// A client of the MCP endpoint, through nginx.
    fn client(&self, token: &str) -> HttpClient {
        HttpClient::new(self.url())
            .with_http(self.http())
            .with_bearer(token)
    }

    /// Stops replica `i` as systemd would (SIGTERM, then waiting for it to exit).
    fn stop(&mut self, i: usize) {
        self.replicas[i].terminate();
        let status = self.replicas[i].wait_exit(Duration::from_secs(40));
        assert!(status.success(), "replica {i} drained and exited 0");
    }

    /// Starts replica `i` again and waits, as an operator does, until its `/readyz` says
    /// it is ready (keys loaded, bus listening).
    fn restart(&mut self, i: usize) {
        self.replicas[i] = replica(self.ports[i], &self.env);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready(self.ports[i]) {
            assert!(Instant::now() < deadline, "replica {i} never became ready");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether `/readyz` on `port` answers 200.
fn ready(port: u16) -> bool {
    use std::io::{Read as _, Write as _};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let probe = "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    let mut head = [0u8; 12];
    s.write_all(probe.as_bytes()).is_ok()
        && s.read_exact(&mut head).is_ok()
        && head.ends_with(b" 200")
}

fn replica(port: u16, env: &[(String, String)]) -> ServerProcess {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    ServerProcess::start_with_env(port, &[], &env)
}

/// nginx running `deploy/nginx/wharf.conf` in the foreground, its upstream replaced by the
/// test's replicas, its addresses by free ports on 127.0.0.1 and its certificate by one made
/// for `localhost`.
struct Nginx {
    child: Child,
    /// The TLS port.
    port: u16,
    /// The plain HTTP port.
    plain_port: u16,
    /// The certificate (PEM) a client trusts.
    ca: PathBuf,
}

impl Nginx {
    fn start(dir: &Path, upstreams: &[u16], edits: &[(&str, &str)]) -> Nginx {
        let shipped = std::fs::read_to_string(deploy_file("nginx/wharf.conf")).unwrap();
        let port = free_port();
        let mut conf: String = shipped
            .lines()
            .filter(|l| !l.trim_start().starts_with("server 127.0.0.1:"))
            .map(|l| format!("{l}\n"))
            .collect();
        let servers: String = upstreams
            .iter()
            .map(|p| format!("    server 127.0.0.1:{p} max_fails=3 fail_timeout=5s;\n"))
            .collect();
        conf = conf.replacen(
            "upstream wharf {\n",
            &format!("upstream wharf {{\n{servers}"),
            1,
        );
        let plain_port = free_port();
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (ca, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&ca, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.key_pair.serialize_pem()).unwrap();
        for (from, to) in [
            ("listen 80;", format!("listen 127.0.0.1:{plain_port};")),
            ("listen 443 ssl;", format!("listen 127.0.0.1:{port} ssl;")),
            (
                "ssl_certificate /etc/ssl/certs/mcp.example.com.pem;",
                format!("ssl_certificate {};", ca.display()),
            ),
            (
                "ssl_certificate_key /etc/ssl/private/mcp.example.com.key;",
                format!("ssl_certificate_key {};", key.display()),
            ),
        ] {
            assert!(conf.contains(from), "the shipped config has {from:?}");
            conf = conf.replacen(from, &to, 1);
        }
        for (from, to) in edits {
            assert!(conf.contains(from), "the shipped config has {from:?}");
            conf = conf.replacen(from, to, 1);
        }
        let site = dir.join("wharf.conf");
        std::fs::write(&site, conf).unwrap();
        let d = dir.display();
        let main = format!(
            "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             include {};\n}}\n",
            site.display()
        );
        let main_path = dir.join("nginx.conf");
        std::fs::write(&main_path, main).unwrap();
        let nginx = ["/usr/sbin/nginx", "nginx"]
            .into_iter()
            .find(|n| {
                Command::new(n)
                    .arg("-v")
                    .stderr(Stdio::null())
                    .status()
                    .is_ok()
            })
            .expect("nginx (Debian's nginx-light) is required: scripts/services.sh installs it");
        let child = Command::new(nginx)
            .args(["-e", &format!("{d}/error.log"), "-p"])
            .arg(dir)
            .arg("-c")
            .arg(&main_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not start: {}",
                std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Nginx {
            child,
            port,
            plain_port,
            ca,
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers too (SIGKILL would orphan them).
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = common::scratch(format!("wharf-{tag}-{}", unique("d")));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.0.join("error.log")).unwrap_or_default();
            eprintln!("nginx error.log:\n{log}");
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Through nginx's round-robin: a dataset read page by page, a confirmation answered on
/// whichever replica the next request reaches, and a commit's `resources/updated` on a listen
/// stream held by some replica.
async fn nginx_round_robin_serves_pages_rounds_and_changes(store: &str) {
    let fleet = Fleet::start(store, &[], &[]);
    let client = fleet.client(TOKEN_42);
    let dataset = unique("fleet");
    let uri = format!("dataset://{dataset}");
    let mut updates = Box::pin(listen(&client, &uri).await);
    committed_dataset(&client, &dataset, 25).await;
    let n = next_notification(&mut updates).await;
    validate_message("subscriptions/listen", &n);
    assert_eq!(n["params"]["uri"], uri.as_str(), "{n}");

    let (ids, pages) = read_pages(&client, &dataset, 4).await;
    assert_eq!(ids, (0..25).collect::<Vec<_>>());
    assert_eq!(pages, 7, "seven pages, spread over the three replicas");

    let asked = confirm_round(&client, &dataset, None).await;
    let state = asked["requestState"].as_str().unwrap().to_owned();
    let done = confirm_round(&client, &dataset, Some(&state)).await;
    assert_eq!(done["structuredContent"]["deletedRows"], 25, "{done}");
    let n = next_notification(&mut updates).await;
    assert_eq!(n["params"]["uri"], uri.as_str(), "{n}");

    // Plain HTTP only points at HTTPS, and the probes stay behind the proxy.
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("http://127.0.0.1:{}/mcp", fleet.nginx.plain_port))
        .header("authorization", format!("Bearer {TOKEN_42}"))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 308);
    assert_eq!(plain.headers()["location"], "https://mcp.example.com/mcp");
    let https = fleet.url().replace("/mcp", "");
    for probe in ["/readyz", "/healthz"] {
        let res = fleet.http().get(format!("{https}{probe}")).send().await;
        assert_eq!(res.unwrap().status(), 404, "{probe} through nginx");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_nginx_round_robin_serves_pages_rounds_and_changes() {
    nginx_round_robin_serves_pages_rounds_and_changes(&pg_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_nginx_round_robin_serves_pages_rounds_and_changes() {
    nginx_round_robin_serves_pages_rounds_and_changes(&redis_url()).await;
}

/// The Python SDK's last 1.x client (legacy sessions only) through nginx's round-robin: its
/// POSTs, its GET stream, its answer to an elicitation and its DELETE each reach whichever
/// replica nginx picks (tests/python/test_sdk_legacy.py says what it checks).
async fn a_legacy_python_client_works_through_round_robin(store: &str) {
    let fleet = Fleet::start(store, &[], &[]);
    let python = common::peers::venv_python("pyvenv-legacy");
    let script = format!(
        "{}/../../tests/python/test_sdk_legacy.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let (url, ca) = (fleet.url(), fleet.nginx.ca.clone());
    let run = python.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(run)
            .arg(script)
            .env("WHARF_URL", url)
            .env("SSL_CERT_FILE", ca)
            .env("WHARF_TOKEN", TOKEN_42)
            .output()
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("{python}: {e} (scripts/test.sh installs mcp==1.30.0 there)"));
    assert!(
        out.status.success(),
        "the legacy client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_legacy_python_client_works_through_round_robin() {
    a_legacy_python_client_works_through_round_robin(&pg_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_legacy_python_client_works_through_round_robin() {
    a_legacy_python_client_works_through_round_robin(&redis_url()).await;
}

/// Appends `batches` batches of `size` rows through nginx, one at a time, each with its
/// own idempotency key, retrying a batch until it is answered; counts the errors seen.
async fn append_load(
    client: HttpClient,
    import: String,
    batches: i64,
    size: i64,
    errors: Arc<AtomicUsize>,
) {
    for b in 0..batches {
        let args = json!({ "import": import, "rows": rows(b * size, size), "idempotency_key": format!("batch-{b}") });
        loop {
            match client.call_tool("import_append_rows", args.clone()).await {
                Ok(reply) if reply.result().is_some_and(|r| r["isError"] != true) => break,
                Ok(reply) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("append batch {b}: {}", reply.body);
                }
                Err(e) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("append batch {b}: {e}");
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A rolling restart of the three replicas (each drained with SIGTERM, then started again)
/// under idempotent write load: nothing lost, nothing doubled, and the client never sees an
/// error. A listen stream whose replica goes ends cleanly; listened to again, it hears the
/// commit made after the restart.
async fn a_rolling_restart_under_write_load_shows_the_client_no_error(store: &str) {
    let mut fleet = Fleet::start(store, &[], &[]);
    let client = fleet.client(TOKEN_42);
    let dataset = unique("rolling");
    let uri = format!("dataset://{dataset}");
    let import = begin(&client, &dataset).await;
    let errors = Arc::new(AtomicUsize::new(0));
    let load = tokio::spawn(append_load(
        client.clone(),
        import.clone(),
        i64::MAX,
        10,
        Arc::clone(&errors),
    ));
    // A listener that listens again whenever its stream ends.
    let (heard_tx, mut heard) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let ends = Arc::new(AtomicUsize::new(0));
    let listener = {
        let (client, uri, ends) = (client.clone(), uri.clone(), Arc::clone(&ends));
        tokio::spawn(async move {
            loop {
                // As a client does: listen again when the stream ends (or could not open).
                let params = json!({ "notifications": { "resourceSubscriptions": [uri] } });
                let Ok(stream) = client.open_stream("subscriptions/listen", params).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let mut stream = Box::pin(stream);
                while let Some(m) = stream.next().await {
                    if m["method"] == "notifications/resources/updated" {
                        let _ = heard_tx.send(m);
                    } else if m["result"]["resultType"] == "complete" {
                        validate_message("subscriptions/listen", &m);
                        ends.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    // The load runs before the first replica goes.
    while staged(&client, &import).await == 0 {
        tokio::task::yield_now().await;
    }
    for i in 0..3 {
        fleet.stop(i);
        fleet.restart(i);
    }
    load.abort();
    let _ = load.await;
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "the client saw no error during the rolling restart"
    );
    let staged = staged(&client, &import).await;
    assert!(staged >= 100, "the load kept going ({staged} rows)");
    ok(
        &client,
        "import_commit",
        json!({ "import": import, "idempotency_key": "commit" }),
    )
    .await;
    let ids = read_pages(&client, &dataset, 500).await.0;
    assert_eq!(
        ids,
        (0..i64::try_from(staged).unwrap()).collect::<Vec<_>>(),
        "every row exactly once"
    );
    assert!(
        ends.load(Ordering::Relaxed) >= 1,
        "the listen stream's replica went, and its stream ended with a final result"
    );
    let n = tokio::time::timeout(Duration::from_secs(10), heard.recv())
        .await
        .expect("the re-established stream hears the commit")
        .unwrap();
    assert_eq!(n["params"]["uri"], uri.as_str());
    listener.abort();
}

/// Replicas SIGKILLed and restarted, one after another, under idempotent write load with
/// client retries: every row exactly once.
async fn a_sigkill_loop_under_write_load_loses_and_doubles_nothing(store: &str) {
    let mut fleet = Fleet::start(store, &[], &[]);
    let client = fleet.client(TOKEN_42);
    let dataset = unique("killed");
    let import = begin(&client, &dataset).await;
    let errors = Arc::new(AtomicUsize::new(0));
    const BATCHES: i64 = 300;
    let load = tokio::spawn(append_load(
        client.clone(),
        import.clone(),
        BATCHES,
        10,
        Arc::clone(&errors),
    ));
    let mut kills = 0;
    while !load.is_finished() && kills < 12 {
        let i = kills % 3;
        fleet.replicas[i].crash();
        fleet.restart(i);
        kills += 1;
    }
    load.await.unwrap();
    assert!(
        kills >= 3,
        "every replica was killed at least once ({kills})"
    );
    ok(
        &client,
        "import_commit",
        json!({ "import": import, "idempotency_key": "commit" }),
    )
    .await;
    let ids = read_pages(&client, &dataset, 500).await.0;
    assert_eq!(
        ids,
        (0..BATCHES * 10).collect::<Vec<_>>(),
        "every row exactly once ({kills} kills, {} errors retried)",
        errors.load(Ordering::Relaxed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_rolling_restart_under_write_load_shows_the_client_no_error() {
    a_rolling_restart_under_write_load_shows_the_client_no_error(&pg_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_rolling_restart_under_write_load_shows_the_client_no_error() {
    a_rolling_restart_under_write_load_shows_the_client_no_error(&redis_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_sigkill_loop_under_write_load_loses_and_doubles_nothing() {
    a_sigkill_loop_under_write_load_loses_and_doubles_nothing(&pg_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_sigkill_loop_under_write_load_loses_and_doubles_nothing() {
    a_sigkill_loop_under_write_load_loses_and_doubles_nothing(&redis_url()).await;
}

/// TCP connections on 127.0.0.1 as `/proc/net/tcp` lists them: (local port, remote port,
/// state), the state as the kernel numbers it (1 established, 6 time-wait).
fn tcp_sockets() -> Vec<(u16, u16, u8)> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |address: &str| u16::from_str_radix(address.split_once(':').unwrap().1, 16);
    table
        .lines()
        .skip(1)
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let state = u8::from_str_radix(fields[3], 16).unwrap();
            (port(fields[1]).unwrap(), port(fields[2]).unwrap(), state)
        })
        .collect()
}

/// A replica drained while nginx keeps an idle connection to it, which nothing uses during
/// the grace: nginx drops it (its upstream keep-alive is shorter than the shipped grace)
/// before the replica would close it. Were it the other way round, a request nginx wrote on
/// that connection as the replica closed it would fail with 502 (what the rolling restart
/// under load could hit). Who closed first is who holds the connection's time-wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_drops_its_idle_connections_to_a_draining_replica_first() {
    let mut fleet = Fleet::start(&redis_url(), &[], &[]);
    let client = fleet.client(TOKEN_42);
    let replica = fleet.ports[0];
    // Requests through nginx until it keeps a connection to the first replica.
    let mut kept = None;
    for _ in 0..30 {
        let listed = client.request("tools/list", json!({})).await.unwrap();
        assert!(listed.result().is_some(), "{}", listed.body);
        kept = tcp_sockets()
            .into_iter()
            .find(|&(local, _, state)| local == replica && state == 1)
            .map(|(_, nginx_port, _)| nginx_port);
        if kept.is_some() {
            break;
        }
    }
    let nginx_port = kept.expect("nginx keeps a connection to the replica");
    fleet.stop(0);
    let sockets = tcp_sockets();
    assert!(
        sockets.contains(&(nginx_port, replica, 6)),
        "nginx closed its idle connection to the draining replica first: {:?}",
        sockets
            .iter()
            .filter(|s| [s.0, s.1] == [nginx_port, replica] || [s.0, s.1] == [replica, nginx_port])
            .collect::<Vec<_>>()
    );
}

/// A call streaming progress with 20 s between events, through nginx whose idle timeout is
/// 10 s: the replicas' keep-alive comments (every 4 s here) keep it alive to its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_stream_outlives_the_proxy_idle_timeout() {
    let fleet = Fleet::start(
        &pg_url(),
        &[("WHARF_PROFILE", "demo"), ("WHARF_KEEP_ALIVE_SECS", "4")],
        &[("proxy_read_timeout 1h;", "proxy_read_timeout 10s;")],
    );
    let client = fleet.client(TOKEN_42);
    let params = json!({ "name": "slow_count",
        "arguments": { "steps": 1, "interval_ms": 20_000 },
        "_meta": { "progressToken": "quiet" } });
    let messages: Vec<Value> = client
        .open_stream("tools/call", params)
        .await
        .unwrap()
        .collect()
        .await;
    let last = messages.last().expect("the call's answer");
    assert_eq!(
        last["result"]["content"][0]["text"], "counted 1",
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m["method"] == "notifications/progress"),
        "{messages:?}"
    );
}
