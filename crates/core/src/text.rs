//! Short lists in messages: a few names and how many more.

use std::fmt::Display;

/// The first `n` of `items`, comma-separated, then ` and k more` when `k` of them are left out.
pub fn some_of<T: Display>(items: impl ExactSizeIterator<Item = T>, n: usize) -> String {
    let more = items.len().saturating_sub(n);
    let shown: Vec<String> = items.take(n).map(|item| item.to_string()).collect();
    match more {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::some_of;

    #[test]
    fn shows_the_first_and_counts_the_rest() {
        let cases: &[(&[&str], usize, &str)] = &[
            (&[], 3, ""),
            (&["a"], 3, "a"),
            (&["a", "b", "c"], 3, "a, b, c"),
            (&["a", "b", "c", "d"], 3, "a, b, c and 1 more"),
            (&["a", "b", "c", "d", "e"], 2, "a, b and 3 more"),
            (&["a", "b"], 0, " and 2 more"),
        ];
        for (items, n, want) in cases {
            assert_eq!(some_of(items.iter(), *n), *want, "{items:?} n={n}");
        }
    }
}
