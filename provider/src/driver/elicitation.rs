//! MCP elicitations the runner can put to the user as one question (Claude's and Codex's
//! drivers both forward them).

use serde_json::Value;

/// The one field of an elicitation's requested schema when it is a single string: its name and
/// its allowed values (empty: free text). `None` for anything else (several fields, numbers,
/// nested objects, an `enum` that is not a list of strings): such an elicitation is declined.
pub fn single_string_field(schema: Option<&Value>) -> Option<(String, Vec<String>)> {
    let properties = schema?.get("properties")?.as_object()?;
    let mut fields = properties.iter();
    let (name, field) = fields.next()?;
    if fields.next().is_some() || field.get("type").and_then(Value::as_str) != Some("string") {
        return None;
    }
    let options = match field.get("enum") {
        None => Vec::new(),
        Some(values) => values
            .as_array()?
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()?,
    };
    Some((name.clone(), options))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_string_field_or_nothing() {
        let schema = |properties: Value| json!({ "type": "object", "properties": properties });
        let read = |properties: Value| single_string_field(Some(&schema(properties)));
        assert_eq!(
            read(json!({"color": {"type": "string", "enum": ["red", "blue"]}})),
            Some((
                "color".to_owned(),
                vec!["red".to_owned(), "blue".to_owned()]
            ))
        );
        assert_eq!(
            read(json!({"name": {"type": "string"}})),
            Some(("name".to_owned(), Vec::new()))
        );
        for declined in [
            json!({"a": {"type": "string"}, "b": {"type": "string"}}),
            json!({"n": {"type": "number"}}),
            json!({"c": {"type": "string", "enum": "red"}}),
            json!({"c": {"type": "string", "enum": ["red", 2]}}),
            json!({}),
        ] {
            assert_eq!(read(declined.clone()), None, "{declined}");
        }
        assert_eq!(single_string_field(None), None);
    }
}
