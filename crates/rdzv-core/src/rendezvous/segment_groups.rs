//! Workers grouped by segment, the rule every segment-aware decision starts from: segments in
//! the order of their first appearance, each segment's workers in their given order.

/// `items` grouped by the segment `segment_of` says each is in (workers without one form a
/// group of their own), groups in the order of their first item, items in their order.
pub(super) fn by_segment<T>(
    items: impl IntoIterator<Item = T>,
    segment_of: impl Fn(&T) -> Option<&str>,
) -> Vec<(Option<String>, Vec<T>)> {
    let mut groups: Vec<(Option<String>, Vec<T>)> = Vec::new();
    for item in items {
        let label = segment_of(&item).map(str::to_string);
        match groups.iter_mut().find(|(segment, _)| *segment == label) {
            Some((_, members)) => members.push(item),
            None => groups.push((label, vec![item])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_follow_first_appearance_and_keep_order_inside() {
        let workers = [("a", Some("s2")), ("b", None), ("c", Some("s1")), ("d", Some("s2")), ("e", None)];
        let groups = by_segment(workers, |(_, segment)| *segment);
        let shown: Vec<(Option<&str>, Vec<&str>)> =
            groups.iter().map(|(s, ws)| (s.as_deref(), ws.iter().map(|(n, _)| *n).collect())).collect();
        assert_eq!(shown, [(Some("s2"), vec!["a", "d"]), (None, vec!["b", "e"]), (Some("s1"), vec!["c"])]);
        assert!(by_segment(Vec::<(&str, Option<&str>)>::new(), |(_, s)| *s).is_empty());
    }
}
