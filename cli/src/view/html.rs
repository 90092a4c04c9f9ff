//! The page writer: the template with its style, script and data inlined.

use std::io::Write;

use serde_json::Value;

const PAGE: &str = include_str!("page.html");
const STYLE: &str = include_str!("view.css");
const SCRIPT: &str = include_str!("view.js");

/// JSON that is safe inside a `<script>` element: no `</script>` or `<!--` can end or bend it
/// (every `<` is written `\u003c`, which JSON reads back as `<`).
pub fn script_json(data: &Value) -> String {
    data.to_string()
        .replace('<', "\\u003c")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// The page for `data` (from [`super::model::build`]).
pub fn page(data: &Value) -> String {
    let title = data["path"]
        .as_str()
        .unwrap_or("trace")
        .replace('&', "&amp;")
        .replace('<', "&lt;");
    PAGE.replace("/*STYLE*/", STYLE)
        .replace("{{TITLE}}", &title)
        .replace("/*SCRIPT*/", SCRIPT)
        .replace("/*DATA*/", &script_json(data))
}

pub fn write(data: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    out.write_all(page(data).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn data_cannot_close_the_script() {
        let data = json!({"path": "</script><b>", "findings": [{"message": "<!-- x"}]});
        let html = page(&data);
        assert_eq!(
            html.matches("</script>").count(),
            PAGE.matches("</script>").count()
        );
        assert!(!html.contains("<!-- x"));
        assert!(html.contains("&lt;/script>"));
        // The template's placeholders are all filled.
        assert!(!html.contains("/*DATA*/") && !html.contains("/*SCRIPT*/"));
    }

    #[test]
    fn the_page_loads_nothing_from_the_network() {
        let html = page(&json!({}));
        for needle in ["http://", "https://", "src=", "@import", "url("] {
            assert!(!html.contains(needle), "the page references {needle}");
        }
    }
}
