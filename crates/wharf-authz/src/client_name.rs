//! What a client may call itself: the name the consent page shows, beside the host its
//! metadata document came from (or the notice that a registered client's name is not
//! verified).

/// What a valid name is, for the refusals that name the rule.
pub(crate) const EXPECTED: &str = "a string of 1 to 200 characters, not all blank, without control characters or \
     bidirectional and zero-width formatting marks";

/// The longest name shown.
const MAX_CHARS: usize = 200;

/// Whether `name` may be shown on the consent page. Besides a length, it must not hold a
/// character that changes how the text around it reads: with a right-to-left override a
/// name could make the page's "from <host>" line show a host of its choosing, and
/// zero-width marks hide what a name really says.
pub(crate) fn is_displayable(name: &str) -> bool {
    !name.trim().is_empty()
        && name.chars().count() <= MAX_CHARS
        && !name.chars().any(|c| c.is_control() || is_formatting(c))
}

/// The bidirectional controls (Unicode's Bidi_Control), the zero-width marks and
/// invisible operators, and the byte-order mark.
fn is_formatting(c: char) -> bool {
    matches!(
        c,
        '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{FEFF}'
    )
}

#[cfg(test)]
mod tests {
    use super::is_displayable;

    #[test]
    fn names_that_would_change_the_page_around_them_are_refused() {
        assert!(is_displayable("Example MCP Client"));
        assert!(is_displayable("Клиент (日本語) — v2"));
        assert!(is_displayable(&"x".repeat(200)));
        for name in [
            String::new(),
            "   ".to_owned(),
            "x".repeat(201),
            "Claude Code from \u{202E}moc.edualc".to_owned(),
            "Trusted\u{2067} App".to_owned(),
            "Zero\u{200B}Width".to_owned(),
            "line\nbreak".to_owned(),
            "\u{FEFF}BOM".to_owned(),
        ] {
            assert!(!is_displayable(&name), "{name:?}");
        }
    }
}
