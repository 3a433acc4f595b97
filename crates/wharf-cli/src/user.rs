//! `wharf user add|passwd|remove NAME`: the local accounts of the embedded authorization
//! server, in its store, and the people an upstream provider signed in. Passwords are read from standard input, never from the command line,
//! where other users of the machine and shell history would see them.

use std::io::BufRead as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use wharf_auth::Secret;
use wharf_store::StoreOptions;

/// `wharf user`.
#[derive(Debug, Args)]
pub(crate) struct UserArgs {
    #[command(subcommand)]
    command: UserCommand,
}

#[derive(Debug, Subcommand)]
enum UserCommand {
    /// Add an account; its password is the first line of standard input.
    Add(Account),
    /// Give an account a new password (the first line of standard input), and sign it out
    /// everywhere: its sessions end and its tokens are revoked.
    Passwd(Account),
    /// Remove an account, with its sessions, consents and tokens. Given PROVIDER:SUBJECT, a
    /// person an upstream provider signed in, sign them out everywhere instead (sessions
    /// end, consents go, tokens are revoked); they can sign in through the provider again,
    /// so disable them there too.
    Remove(Account),
}

/// The account a command is about, and where it is kept.
#[derive(Debug, Args)]
struct Account {
    /// The user name (letters, digits, '.', '_', '-', '@'); for `remove`, also
    /// PROVIDER:SUBJECT, as an upstream provider's people are named here.
    name: String,
    /// The store the server uses (default sqlite://./wharf.db).
    #[arg(long, env = "WHARF_STORE", hide_env_values = true)]
    store: Option<Secret>,
}

impl Account {
    /// The store's URL as given (or the default).
    fn url(&self) -> &str {
        self.store
            .as_ref()
            .map_or(wharf_store::DEFAULT_URL, |s| s.expose())
    }

    /// Where the accounts are kept, to name in what the command says: the store's URL
    /// without its password. A relative SQLite path is named as the file it opens here,
    /// so an account added from the wrong directory shows where it went.
    fn kept_in(&self) -> String {
        let url = self.url();
        if let Some(path) = url.strip_prefix("sqlite://") {
            let file = path.split('?').next().unwrap_or(path);
            return match std::path::absolute(file) {
                Ok(file) => format!("sqlite://{}", file.display()),
                Err(_) => url.to_owned(),
            };
        }
        match url::Url::parse(url) {
            Ok(mut parsed) => {
                if parsed.password().is_some() {
                    let _ = parsed.set_password(Some("xxxxx"));
                }
                parsed.to_string()
            }
            Err(_) => url.to_owned(),
        }
    }

    async fn users(&self) -> anyhow::Result<wharf_authz::Users> {
        let url = self.url();
        // A throwaway file: an account added there is gone when the command ends.
        anyhow::ensure!(
            !url.starts_with("memory://") && !url.contains(":memory:"),
            "memory:// and in-memory SQLite keep nothing after this command ends: give --store (or WHARF_STORE) the store the server uses"
        );
        let store = wharf_store::open(url, &StoreOptions::default())
            .await
            .context("cannot open the store")?;
        Ok(wharf_authz::Users::new(store))
    }
}

/// The password: asked for at a terminal without showing it (twice, to catch a typing
/// slip), else the first line of standard input, without its line ending.
fn password() -> anyhow::Result<String> {
    use std::io::IsTerminal as _;
    if std::io::stdin().is_terminal() {
        return dialoguer::Password::new()
            .with_prompt("Password")
            .with_confirmation("Again", "the two passwords differ")
            .interact()
            .context("cannot read the password from the terminal");
    }
    let mut password = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut password)
        .context("cannot read the password from standard input")?;
    Ok(password.trim_end_matches(['\n', '\r']).to_owned())
}

pub(crate) fn run(args: UserArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wharf: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(user(args)) {
        Ok(message) => {
            eprintln!("{message}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("wharf: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn user(args: UserArgs) -> anyhow::Result<String> {
    match args.command {
        UserCommand::Add(account) => {
            let password = password()?;
            account.users().await?.add(&account.name, &password).await?;
            Ok(format!(
                "user {} added to {}",
                account.name,
                account.kept_in()
            ))
        }
        UserCommand::Passwd(account) => {
            let password = password()?;
            let users = account.users().await?;
            users.set_password(&account.name, &password).await?;
            Ok(format!(
                "password of {} changed in {}; its sessions ended and its tokens revoked",
                account.name,
                account.kept_in()
            ))
        }
        UserCommand::Remove(account) => match account.users().await?.remove(&account.name).await? {
            wharf_authz::Removed::UpstreamPerson => Ok(format!(
                "{} signed out everywhere: sessions ended, consents forgotten, tokens revoked \
                 (they can sign in through the provider again)",
                account.name
            )),
            _ => Ok(format!(
                "user {} removed, with its sessions, consents and tokens",
                account.name
            )),
        },
    }
}
