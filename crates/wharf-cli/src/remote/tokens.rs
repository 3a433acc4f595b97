//! Tokens `wharf login` obtained, kept per server in the OS keyring when one answers (the
//! Secret Service on Linux, the Keychain on macOS), else in a file only the user can read;
//! refreshed when they are about to expire.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Unreachable;

/// What a login left: the tokens and what it takes to refresh them.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Grant {
    /// The bearer token sent to the server.
    pub(crate) access_token: String,
    /// The token that buys the next access token, if the server gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) refresh_token: Option<String>,
    /// When the access token expires (Unix seconds), if the server said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires_at: Option<u64>,
    /// The authorization server's token endpoint.
    pub(crate) token_endpoint: String,
    /// The client id the tokens were issued to.
    pub(crate) client_id: String,
    /// The resource (RFC 8707) they are bound to.
    pub(crate) resource: String,
}

impl std::fmt::Debug for Grant {
    // The tokens are credentials: never printed, whatever prints a grant.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("expires_at", &self.expires_at)
            .field("token_endpoint", &self.token_endpoint)
            .field("client_id", &self.client_id)
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

/// A refresh this long before expiry avoids sending a token that lapses on the way.
const MARGIN_SECS: u64 = 30;

impl Grant {
    /// A grant from a token endpoint's answer.
    pub(crate) fn from_response(
        body: &Value,
        token_endpoint: &str,
        client_id: &str,
        resource: &str,
        previous_refresh: Option<String>,
    ) -> Result<Self, String> {
        let access_token = body["access_token"].as_str().ok_or_else(|| {
            // Its members' names only: the body may hold a refresh or ID token.
            let members: Vec<&str> = body
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            let why = body["error_description"]
                .as_str()
                .or(body["error"].as_str())
                .unwrap_or("no error named");
            format!("the token endpoint sent no access_token ({why}; members {members:?})")
        })?;
        Ok(Grant {
            access_token: access_token.to_owned(),
            // A server that does not rotate refresh tokens leaves the old one valid.
            refresh_token: body["refresh_token"]
                .as_str()
                .map(str::to_owned)
                .or(previous_refresh),
            expires_at: body["expires_in"].as_u64().map(|s| now() + s),
            token_endpoint: token_endpoint.to_owned(),
            client_id: client_id.to_owned(),
            resource: resource.to_owned(),
        })
    }

    fn is_stale(&self) -> bool {
        self.expires_at.is_some_and(|at| now() + MARGIN_SECS >= at)
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The grants of every server logged in to, in `tokens.json` of the configuration
/// directory (`$WHARF_CONFIG_DIR`, else `$XDG_CONFIG_HOME/wharf`, else `~/.config/wharf`),
/// created mode 0600 in a directory of mode 0700.
#[derive(Debug)]
struct TokenFile {
    path: PathBuf,
}

impl TokenFile {
    /// The user's token file (it need not exist yet).
    fn open() -> Result<Self, String> {
        // The XDG Base Directory rules for its variables: an empty or relative value is
        // ignored (a token file in whatever directory the command runs from could end up in
        // a repository). Wharf's own variable is taken as given.
        let absolute =
            |name: &str| std::env::var_os(name).filter(|v| PathBuf::from(v).is_absolute());
        let dir = match (
            std::env::var_os("WHARF_CONFIG_DIR"),
            absolute("XDG_CONFIG_HOME"),
            absolute("HOME"),
        ) {
            (Some(dir), _, _) => PathBuf::from(dir),
            (None, Some(config), _) => PathBuf::from(config).join("wharf"),
            (None, None, Some(home)) => PathBuf::from(home).join(".config").join("wharf"),
            (None, None, None) => {
                return Err(
                    "no place for tokens: set WHARF_CONFIG_DIR, or HOME to an absolute path"
                        .to_owned(),
                );
            }
        };
        Ok(TokenFile {
            path: dir.join("tokens.json"),
        })
    }

    /// Where the tokens are kept.
    fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Waits for, then holds, the lock every change of the tokens takes (an advisory lock
    /// on a file beside them, released when the guard is dropped). Two commands refreshing
    /// one login at once would present one refresh token twice, which an authorization
    /// server takes for theft, revoking the login; and two writes of the file at once (two
    /// logins, a login and a refresh) would each rewrite it from what it held before, so one
    /// grant would be lost.
    async fn lock(&self) -> Result<TokensLock, String> {
        let dir = self
            .path
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .to_owned();
        let path = dir.join("tokens.lock");
        let failed = move |e: std::io::Error| format!("{}: {e}", path.display());
        let take = move || {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(&failed)?;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(dir.join("tokens.lock"))
                .map_err(&failed)?;
            file.lock().map_err(&failed)?;
            Ok::<_, String>(file)
        };
        tokio::task::spawn_blocking(take)
            .await
            .map_err(|e| e.to_string())?
            .map(|file| TokensLock { _file: file })
    }

    fn read(&self) -> Result<BTreeMap<String, Grant>, String> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "{} is damaged ({e}); remove it and log in again",
                    self.path.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(e) => Err(format!("{}: {e}", self.path.display())),
        }
    }

    /// The grant for endpoint `url`, if logged in.
    fn get(&self, url: &str) -> Result<Option<Grant>, String> {
        Ok(self.read()?.remove(key(url)))
    }

    /// Keeps `grant` for endpoint `url`, under the lock: it rewrites what it read.
    fn put(&self, held: &TokensLock, url: &str, grant: Grant) -> Result<(), String> {
        let mut all = self.read()?;
        all.insert(key(url).to_owned(), grant);
        self.write(held, &all)
    }

    /// Forgets the grant for endpoint `url`, if there is one, under the lock.
    fn remove(&self, held: &TokensLock, url: &str) -> Result<(), String> {
        let mut all = self.read()?;
        if all.remove(key(url)).is_none() {
            return Ok(());
        }
        self.write(held, &all)
    }

    /// Replaces the file whole with `all` (a crash leaves the old file or the new one, never
    /// half of one).
    fn write(&self, _held: &TokensLock, all: &BTreeMap<String, Grant>) -> Result<(), String> {
        let dir = self.path.parent().unwrap_or(std::path::Path::new("."));
        let failed = |e: std::io::Error| format!("{}: {e}", self.path.display());
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(failed)?;
        // A directory made before (by hand, or by another tool) may be open to others.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(failed)?;
        let temporary = dir.join(format!(".tokens.{}.tmp", std::process::id()));
        // `mode` applies only to a file it creates: a leftover keeps its own, so it goes.
        match std::fs::remove_file(&temporary) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(failed(e)),
            _ => {}
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .map_err(failed)?;
        let json = serde_json::to_vec_pretty(all).map_err(|e| e.to_string())?;
        file.write_all(&json)
            .and_then(|()| file.sync_all())
            .map_err(failed)?;
        std::fs::rename(&temporary, &self.path).map_err(failed)
    }
}

/// The lock on the user's tokens (see [`TokenFile::lock`]), held until dropped.
#[derive(Debug)]
pub(crate) struct TokensLock {
    _file: std::fs::File,
}

/// One key per endpoint, whatever trailing slash it was typed with.
fn key(url: &str) -> &str {
    url.trim_end_matches('/')
}

/// Where grants are kept: the OS keyring when one answers, else the token file. An explicit
/// `WHARF_CONFIG_DIR` means that directory's file only.
#[derive(Debug)]
pub(crate) struct Tokens {
    file: TokenFile,
    keyring: bool,
}

/// The keyring's service name for Wharf's entries (one per endpoint URL).
const KEYRING_SERVICE: &str = "wharf";

impl Tokens {
    /// The user's tokens.
    pub(crate) fn open() -> Result<Self, String> {
        Ok(Tokens {
            file: TokenFile::open()?,
            keyring: std::env::var_os("WHARF_CONFIG_DIR").is_none(),
        })
    }

    /// The grant for endpoint `url`, if logged in.
    pub(crate) async fn get(&self, url: &str) -> Result<Option<Grant>, String> {
        if self.keyring
            && let Ok(Some(secret)) = keyring_op(url, Keyring::Get).await
            && let Ok(grant) = serde_json::from_str(&secret)
        {
            return Ok(Some(grant));
        }
        self.file.get(url)
    }

    /// Waits for, then holds, the lock a change of the tokens takes.
    pub(crate) async fn lock(&self) -> Result<TokensLock, String> {
        self.file.lock().await
    }

    /// Keeps `grant` for endpoint `url`, under the lock; says where. Only one copy is
    /// left: a refresh token is good once, and a second copy, read where the other store
    /// does not answer (a session without the keyring), would send a used one, which the
    /// authorization server takes for a stolen one and revokes the whole login for.
    pub(crate) async fn put(
        &self,
        held: &TokensLock,
        url: &str,
        grant: Grant,
    ) -> Result<String, String> {
        if self.keyring {
            let secret = serde_json::to_string(&grant).map_err(|e| e.to_string())?;
            if keyring_op(url, Keyring::Set(secret)).await.is_ok() {
                self.file.remove(held, url)?;
                return Ok("the OS keyring".to_owned());
            }
        }
        self.file.put(held, url, grant)?;
        if self.keyring {
            // A keyring that refused the write may still hold an older grant, which `get`
            // would read first. Best effort: one that does not answer holds nothing it
            // would give.
            let _ = keyring_op(url, Keyring::Delete).await;
        }
        Ok(self.file.path().display().to_string())
    }
}

/// What to do with a keyring entry.
enum Keyring {
    Get,
    Set(String),
    Delete,
}

/// Reads, writes or deletes the keyring entry of `url`, off the async threads (the
/// keyring's calls block). Any failure means "no keyring here".
async fn keyring_op(url: &str, op: Keyring) -> Result<Option<String>, String> {
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    {
        let user = key(url).to_owned();
        let op = move || -> Result<Option<String>, keyring::Error> {
            let entry = keyring::Entry::new(KEYRING_SERVICE, &user)?;
            match op {
                Keyring::Set(secret) => entry.set_password(&secret).map(|()| None),
                Keyring::Get => match entry.get_password() {
                    Ok(s) => Ok(Some(s)),
                    Err(keyring::Error::NoEntry) => Ok(None),
                    Err(e) => Err(e),
                },
                Keyring::Delete => match entry.delete_credential() {
                    Ok(()) | Err(keyring::Error::NoEntry) => Ok(None),
                    Err(e) => Err(e),
                },
            }
        };
        tokio::task::spawn_blocking(op)
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        let _ = (url, op, KEYRING_SERVICE);
        Err("no keyring on this platform".to_owned())
    }
}

/// The access token to send to `url`: the stored one, refreshed first when it is about to
/// expire. `None` when nobody logged in there.
///
/// `refused` says the server just refused the stored token (revoked, or expired early): it
/// is refreshed whatever its stated expiry, and `None` comes back when it cannot be.
pub(crate) async fn token_for(url: &str, refused: bool) -> Result<Option<String>, Unreachable> {
    let tokens = Tokens::open().map_err(Unreachable::fatal)?;
    refreshed(&tokens, url, refused).await
}

/// [`token_for`] with `tokens`: a refresh that failed for a reason that may pass (the
/// authorization server unreachable, 5xx, 429) says so, and to try again, not to log in.
async fn refreshed(
    tokens: &Tokens,
    url: &str,
    refused: bool,
) -> Result<Option<String>, Unreachable> {
    let fatal = Unreachable::fatal;
    let Some(grant) = tokens.get(url).await.map_err(fatal)? else {
        return Ok(None);
    };
    if !grant.is_stale() && !refused {
        return Ok(Some(grant.access_token));
    }
    if refused && grant.refresh_token.is_none() {
        return Ok(None);
    }
    // One refresh at a time: whoever waited finds the login refreshed by the one before it.
    let held = tokens.lock().await.map_err(fatal)?;
    let Some(current) = tokens.get(url).await.map_err(fatal)? else {
        return Ok(None);
    };
    if current.access_token != grant.access_token && !current.is_stale() {
        return Ok(Some(current.access_token));
    }
    let grant = current;
    let again = format!("run `wharf login {url}` again");
    let Some(refresh) = grant.refresh_token.clone() else {
        return Err(fatal(format!("the login to {url} expired; {again}")));
    };
    // Kept by an earlier version, or written by hand: the refresh token goes nowhere
    // unencrypted.
    super::oauth::secure_url("the stored token_endpoint", &grant.token_endpoint)
        .map_err(|e| fatal(format!("{e}; {again}")))?;
    let form = [
        ("grant_type", "refresh_token"),
        ("refresh_token", refresh.as_str()),
        ("client_id", grant.client_id.as_str()),
        ("resource", grant.resource.as_str()),
    ];
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| fatal(e.to_string()))?;
    let body = super::oauth::post_form(&http, &grant.token_endpoint, &form)
        .await
        .map_err(|e| match e.may_pass() {
            true => Unreachable::transient(format!(
                "the login to {url} needs a refresh, which its authorization server did not give for now ({e}); try again"
            )),
            false => fatal(format!(
                "the login to {url} expired and its refresh failed ({e}); {again}"
            )),
        })?;
    let fresh = Grant::from_response(
        &body,
        &grant.token_endpoint,
        &grant.client_id,
        &grant.resource,
        Some(refresh),
    )
    .map_err(fatal)?;
    let token = fresh.access_token.clone();
    tokens.put(&held, url, fresh).await.map_err(fatal)?;
    Ok(Some(token))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{Grant, TokenFile, Tokens};

    /// A token response without an access token is named by its error and its members'
    /// names: never by its values, which may be a refresh or an ID token.
    #[test]
    fn a_response_without_an_access_token_shows_no_other_token() {
        let body = serde_json::json!({ "refresh_token": "SECRET-R", "id_token": "SECRET-I",
            "error": "invalid_grant" });
        let refused =
            Grant::from_response(&body, "https://as/token", "c", "https://mcp", None).unwrap_err();
        assert!(!refused.contains("SECRET"), "{refused}");
        assert!(refused.contains("invalid_grant") && refused.contains("refresh_token"));
    }

    fn grant(n: usize) -> Grant {
        Grant {
            access_token: format!("token-{n}"),
            refresh_token: None,
            expires_at: None,
            token_endpoint: "https://auth.example/token".to_owned(),
            client_id: "https://wharf.example/client".to_owned(),
            resource: format!("https://s{n}.example/mcp"),
        }
    }

    /// Logins (and refreshes) running at once each rewrite the whole file: without the lock
    /// one would write what it read before the other's write, and a grant would be lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn logins_at_the_same_time_keep_every_grant() {
        let dir = std::env::temp_dir().join(format!("wharf-tokens-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let tokens = Arc::new(Tokens {
            file: TokenFile {
                path: dir.join("tokens.json"),
            },
            keyring: false,
        });
        let writers = (0..8).map(|w| {
            let tokens = tokens.clone();
            tokio::spawn(async move {
                for i in 0..10 {
                    let n = w * 10 + i;
                    let held = tokens.lock().await?;
                    tokens
                        .put(&held, &format!("https://s{n}.example/mcp"), grant(n))
                        .await?;
                }
                Ok::<_, String>(())
            })
        });
        for writer in writers.collect::<Vec<_>>() {
            writer.await.unwrap().unwrap();
        }
        for n in 0..80 {
            let kept = tokens.file.get(&format!("https://s{n}.example/mcp/"));
            assert_eq!(
                kept.unwrap().map(|g| g.access_token),
                Some(format!("token-{n}")),
                "grant {n}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A refresh its authorization server cannot give for now (unreachable, 5xx, 429) is
    /// worth trying again, and does not tell the user to log in again (`wharf listen` gave
    /// up for good when it met one); a refusal (`invalid_grant`) is final.
    #[tokio::test]
    async fn a_refresh_the_server_cannot_give_for_now_is_tried_again_not_final() {
        use axum::http::StatusCode;
        for (status, error, retry) in [
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                true,
            ),
            (StatusCode::TOO_MANY_REQUESTS, "slow_down", true),
            (StatusCode::BAD_REQUEST, "invalid_grant", false),
        ] {
            let app = axum::Router::new().route(
                "/token",
                axum::routing::post(move || async move {
                    (status, axum::Json(serde_json::json!({ "error": error })))
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let endpoint = format!("http://{}/token", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await });

            let dir = std::env::temp_dir().join(format!(
                "wharf-refresh-{}-{}",
                std::process::id(),
                status.as_u16()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            let tokens = Tokens {
                file: TokenFile {
                    path: dir.join("tokens.json"),
                },
                keyring: false,
            };
            let url = "https://s.example/mcp";
            let stale = Grant {
                refresh_token: Some("r".to_owned()),
                expires_at: Some(1),
                token_endpoint: endpoint,
                ..grant(0)
            };
            let held = tokens.lock().await.unwrap();
            tokens.put(&held, url, stale).await.unwrap();
            drop(held);
            let failed = super::refreshed(&tokens, url, false).await.unwrap_err();
            assert_eq!(failed.retry, retry, "{status}: {}", failed.message);
            assert_eq!(
                failed.message.contains("wharf login"),
                !retry,
                "{status}: {}",
                failed.message
            );
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
