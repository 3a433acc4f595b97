//! What a client may call itself: the name the consent page shows, beside the host its
//! metadata document came from (or the notice that a registered client's name is not
//! verified).

/// What a valid name is, for the refusals that name the rule.
pub(crate) const EXPECTED: &str = "a string of 1 to 200 characters, not all blank, without control characters or \
     invisible or bidirectional formatting marks";

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

/// The bidirectional controls (Unicode's Bidi_Control); the invisible marks, separators and
/// operators, and the byte-order mark; tag characters; and the Hangul fillers, which show
/// as nothing and are not white space. The zero-width joiner and non-joiner stay: Persian
/// and Indic spelling and emoji sequences need them, and they reorder nothing.
fn is_formatting(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{180E}'
            | '\u{200B}'
            | '\u{200E}'
            | '\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{3164}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{E0000}'..='\u{E007F}'
    )
}

#[cfg(test)]
mod tests {
    use super::is_displayable;

    #[test]
    fn names_that_would_change_the_page_around_them_are_refused() {
        assert!(is_displayable("Example MCP Client"));
        assert!(is_displayable("Клиент (日本語) — v2"));
        // Joiners: Persian spelling, an emoji sequence.
        assert!(is_displayable("نرم\u{200C}افزار"));
        assert!(is_displayable("Dev \u{1F469}\u{200D}\u{1F4BB}"));
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
            "\u{3164}".to_owned(),
            "tag\u{E0041}".to_owned(),
            "line\u{2028}separator".to_owned(),
        ] {
            assert!(!is_displayable(&name), "{name:?}");
        }
    }
}
