//! Errors as a person reads them.

/// An error and its causes, as anyhow's `{:#}` prints them, for messages a person can act on:
/// reqwest says "error sending request for url" and keeps why (a certificate refused) in its
/// sources, libcontainer wraps the system call that failed. A cause its error already quotes is
/// not repeated.
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::chain;

    /// An error that says `what`, quoting its cause or not.
    #[derive(Debug)]
    struct Wrapping {
        quotes: bool,
        cause: std::io::Error,
    }

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self.quotes {
                true => write!(f, "sending the request: {}", self.cause),
                false => write!(f, "sending the request"),
            }
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.cause)
        }
    }

    #[test]
    fn causes_follow_once() {
        let cause = || std::io::Error::other("invalid peer certificate");
        let expected = "sending the request: invalid peer certificate";
        for quotes in [false, true] {
            assert_eq!(chain(&Wrapping { quotes, cause: cause() }), expected);
        }
    }
}
