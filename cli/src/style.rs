//! Colour for text meant for a person: the report's headings and each finding's level, in
//! `report`, `demo` and `run`'s summary. Restrained on purpose: headings bold, a level in the
//! colour of its weight, nothing else, so that the text reads the same without it.
//!
//! When: `--color always|never|auto` (before or after the subcommand, as cargo's); `auto`, the
//! default, colours only a terminal, and never when `NO_COLOR` is set to anything but the empty
//! string (no-color.org) or `TERM` is `dumb`. `--color always` wins over `NO_COLOR`, as that
//! convention asks of an explicit flag. The text is rendered plain (`render.rs`) and coloured
//! here, line by line, after it was fitted to its width: escapes never count as columns, and
//! the plain text (pipes, files, `--json`) stays byte for byte what it was.

use std::io::IsTerminal;
use std::sync::OnceLock;

use oomtrace_collector::report::{Confidence, Level, Severity};

/// `--color`: when text for a person is coloured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// On a terminal, unless `NO_COLOR` is set or `TERM=dumb`.
    #[default]
    Auto,
    /// Always, also into pipes and files.
    Always,
    /// Never.
    Never,
}

static CHOICE: OnceLock<ColorChoice> = OnceLock::new();

/// Sets the process's choice (once, from the command line).
pub fn set_choice(choice: ColorChoice) {
    let _ = CHOICE.set(choice);
}

/// Which stream the text goes to.
#[derive(Clone, Copy)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Whether text for `stream` is coloured.
pub fn enabled(stream: Stream) -> bool {
    let terminal = match stream {
        Stream::Stdout => std::io::stdout().is_terminal(),
        Stream::Stderr => std::io::stderr().is_terminal(),
    };
    decide(
        CHOICE.get().copied().unwrap_or_default(),
        terminal,
        std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()),
        std::env::var_os("TERM").is_some_and(|t| t == "dumb"),
    )
}

fn decide(choice: ColorChoice, terminal: bool, no_color: bool, dumb: bool) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => terminal && !no_color && !dumb,
    }
}

const RESET: &str = "\x1b[0m";
const BOLD: &str = "\x1b[1m";
const BOLD_RED: &str = "\x1b[1;31m";
const RED: &str = "\x1b[31m";
const YELLOW: &str = "\x1b[33m";
const CYAN: &str = "\x1b[36m";

/// The colour of a finding's level: errors and confirmed findings red, warnings and likely
/// ones yellow, the rest (info, suspected) cyan.
fn level_color(level: Level) -> &'static str {
    match level {
        Level::Severity(Severity::Error) | Level::Confidence(Confidence::Confirmed) => RED,
        Level::Severity(Severity::Warning) | Level::Confidence(Confidence::Likely) => YELLOW,
        Level::Severity(Severity::Info) | Level::Confidence(Confidence::Suspected) => CYAN,
    }
}

const LEVELS: [Level; 6] = [
    Level::Severity(Severity::Error),
    Level::Severity(Severity::Warning),
    Level::Severity(Severity::Info),
    Level::Confidence(Confidence::Confirmed),
    Level::Confidence(Confidence::Likely),
    Level::Confidence(Confidence::Suspected),
];

/// The level a finding's tag (`confirmed leak`, `oom error`) names, if any.
fn level_of_tag(tag: &str) -> Option<Level> {
    tag.split(' ')
        .find_map(|word| LEVELS.into_iter().find(|l| l.name() == word))
}

/// `text` (the report, or `run`'s summary) with its headings in bold and each finding's
/// `[level kind]` tag in its level's colour; `text` unchanged when `on` is false.
pub fn paint(text: &str, on: bool) -> String {
    if !on {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        paint_line(&mut out, body);
        out.push_str(end);
    }
    out
}

fn paint_line(out: &mut String, line: &str) {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = &line[indent..];
    if rest.is_empty() {
        out.push_str(line);
        return;
    }
    // A heading is flush left ("Findings (2)", "oomtrace summary"); out of memory in red.
    if indent == 0 {
        let color = if rest.starts_with("Out of memory") {
            BOLD_RED
        } else {
            BOLD
        };
        out.push_str(&format!("{color}{rest}{RESET}"));
        return;
    }
    out.push_str(&line[..indent]);
    // The summary's own heading of its OOM.
    if rest == "first out-of-memory:" {
        out.push_str(&format!("{BOLD_RED}{rest}{RESET}"));
        return;
    }
    // A finding: "[confirmed leak] pid 7: ...".
    if let Some(tag) = rest
        .strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .map(|(tag, _)| tag)
    {
        if let Some(level) = level_of_tag(tag) {
            let after = &rest[tag.len() + 2..];
            out.push_str(&format!("{}[{tag}]{RESET}{after}", level_color(level)));
            return;
        }
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_colours_only_a_terminal_without_no_color() {
        assert!(decide(ColorChoice::Auto, true, false, false));
        assert!(!decide(ColorChoice::Auto, false, false, false));
        assert!(!decide(ColorChoice::Auto, true, true, false));
        assert!(!decide(ColorChoice::Auto, true, false, true));
        assert!(decide(ColorChoice::Always, false, true, true));
        assert!(!decide(ColorChoice::Never, true, false, false));
    }

    #[test]
    fn headings_and_levels_are_painted_and_nothing_else() {
        let text =
            "oomtrace report: t.oomt\n\nFindings (1)\n  [confirmed leak] pid 7: +1 MiB\n      \
                    why: [likely] not a tag here\n  [bounded growth] pid 7\n";
        let painted = paint(text, true);
        assert_eq!(
            painted,
            "\x1b[1moomtrace report: t.oomt\x1b[0m\n\n\x1b[1mFindings (1)\x1b[0m\n  \
             \x1b[31m[confirmed leak]\x1b[0m pid 7: +1 MiB\n      why: [likely] not a tag here\n  \
             [bounded growth] pid 7\n"
        );
        assert_eq!(paint(text, false), text);
        // Without escapes the text is the same.
        let plain = painted
            .replace(RESET, "")
            .replace(BOLD, "")
            .replace(RED, "");
        assert_eq!(plain, text);
    }

    #[test]
    fn every_level_has_a_colour_and_is_found_in_its_tag() {
        for level in LEVELS {
            assert_eq!(level_of_tag(&format!("{} leak", level.name())), Some(level));
            assert_eq!(level_of_tag(&format!("oom {}", level.name())), Some(level));
        }
        assert_eq!(level_of_tag("bounded growth"), None);
    }
}
