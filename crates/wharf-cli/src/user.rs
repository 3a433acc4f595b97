//! `wharf user add NAME`: adds a local account to the embedded authorization server's store,
//! reading the password from standard input (never from the command line, where other users
//! of the machine and shell history would see it).

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
    Add {
        /// The user name (letters, digits, '.', '_', '-', '@').
        name: String,
        /// The store the server uses (default sqlite://./wharf.db).
        #[arg(long, env = "WHARF_STORE", hide_env_values = true)]
        store: Option<Secret>,
    },
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
        UserCommand::Add { name, store } => {
            let mut password = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut password)
                .context("cannot read the password from standard input")?;
            let password = password.trim_end_matches(['\n', '\r']);
            let url = store
                .as_ref()
                .map_or(wharf_store::DEFAULT_URL, |s| s.expose());
            let store = wharf_store::open(url, &StoreOptions::default())
                .await
                .context("cannot open the store")?;
            wharf_authz::Users::new(store).add(&name, password).await?;
            Ok(format!("user {name} added"))
        }
    }
}
