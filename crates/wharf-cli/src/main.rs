//! `wharf`: run the reference MCP server over Streamable HTTP or stdio, manage the accounts
//! of its embedded authorization server, and probe, call and listen to any MCP server.

mod remote;
mod serve;
mod signals;
mod telemetry;
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
    /// Probe an MCP endpoint as an operator would; exit code 1 when a check fails.
    Check(remote::check::CheckArgs),
    /// List a server's tools and their arguments.
    Tools(remote::tools::ToolsArgs),
    /// Call a tool: progress bar, questions answered in the terminal, Ctrl-C cancels.
    Call(remote::call::CallArgs),
    /// Print a server's notifications as they come; reconnect when the stream ends.
    Listen(remote::listen::ListenArgs),
    /// Sign in to a server's authorization server (OAuth, PKCE) and keep the tokens.
    Login(remote::login::LoginArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::User(args) => user::run(args),
        Command::Check(args) => remote::check::run(args),
        Command::Tools(args) => remote::tools::run(args),
        Command::Call(args) => remote::call::run(args),
        Command::Listen(args) => remote::listen::run(args),
        Command::Login(args) => remote::login::run(args),
    }
}
