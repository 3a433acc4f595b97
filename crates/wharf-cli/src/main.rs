//! `wharf`: run the reference MCP server over Streamable HTTP or stdio, and manage the
//! accounts of its embedded authorization server.

mod serve;
mod user;

use clap::{Parser, Subcommand};

/// Wharf: stateless MCP (2026-07-28) servers for replicas behind a load balancer.
#[derive(Debug, Parser)]
#[command(name = "wharf", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the reference server.
    Serve(Box<serve::ServeArgs>),
    /// Manage the accounts people sign in with at the embedded authorization server.
    User(user::UserArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::User(args) => user::run(args),
    }
}
