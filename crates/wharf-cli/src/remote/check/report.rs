//! Verdicts and how they are reported: one line per check and a summary for people, one
//! JSON object for machines, and the exit code a CI job or a monitor acts on.

use std::process::ExitCode;

use serde::Serialize;
use serde_json::json;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Verdict {
    /// The server behaves as the spec says.
    Pass,
    /// It does not: the detail says how.
    Fail,
    /// A SHOULD is not met; the endpoint works.
    Warn,
    /// Informational: what the server does where the spec leaves a choice.
    Info,
    /// The check could not run here (no authorization, a feature not offered).
    Skip,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Warn => "WARN",
            Verdict::Info => "INFO",
            Verdict::Skip => "SKIP",
        }
    }
}

/// One check's outcome.
#[derive(Debug, Serialize)]
pub(super) struct Outcome {
    pub(super) name: &'static str,
    pub(super) verdict: Verdict,
    pub(super) detail: String,
}

pub(super) fn pass(name: &'static str, detail: impl Into<String>) -> Outcome {
    Outcome {
        name,
        verdict: Verdict::Pass,
        detail: detail.into(),
    }
}

pub(super) fn fail(name: &'static str, detail: impl Into<String>) -> Outcome {
    Outcome {
        name,
        verdict: Verdict::Fail,
        detail: detail.into(),
    }
}

pub(super) fn skip(name: &'static str, detail: impl Into<String>) -> Outcome {
    Outcome {
        name,
        verdict: Verdict::Skip,
        detail: detail.into(),
    }
}

pub(super) fn info(name: &'static str, detail: impl Into<String>) -> Outcome {
    Outcome {
        name,
        verdict: Verdict::Info,
        detail: detail.into(),
    }
}

/// Prints the verdicts and the summary; the exit code is 1 when a check failed.
pub(super) fn report(url: &str, outcomes: &[Outcome], as_json: bool) -> ExitCode {
    let count = |v: Verdict| outcomes.iter().filter(|o| o.verdict == v).count();
    let failed = count(Verdict::Fail);
    if as_json {
        let doc = json!({
            "url": url,
            "ok": failed == 0,
            "checks": outcomes,
            "summary": {
                "pass": count(Verdict::Pass),
                "fail": failed,
                "warn": count(Verdict::Warn),
                "info": count(Verdict::Info),
                "skip": count(Verdict::Skip),
            },
        });
        outln!("{doc:#}");
    } else {
        outln!("wharf check {url}");
        let width = outcomes.iter().map(|o| o.name.len()).max().unwrap_or(0);
        for o in outcomes {
            let label = match o.verdict {
                Verdict::Pass => console::style(o.verdict.label()).green(),
                Verdict::Fail => console::style(o.verdict.label()).red().bold(),
                Verdict::Warn => console::style(o.verdict.label()).yellow(),
                Verdict::Info | Verdict::Skip => console::style(o.verdict.label()).dim(),
            };
            outln!("  {label}  {:width$}  {}", o.name, o.detail);
        }
        outln!(
            "{} checks: {} passed, {failed} failed, {} warnings, {} skipped",
            outcomes.len(),
            count(Verdict::Pass),
            count(Verdict::Warn),
            count(Verdict::Skip),
        );
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
