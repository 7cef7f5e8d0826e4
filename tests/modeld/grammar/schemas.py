"""JSON schemas that constrained generation is tested on, each with one instance it accepts (for tests that walk a
matcher along a valid answer). Strings, numbers and arrays are bounded, so that every answer can end within a test's
max_tokens."""

NAME = {"type": "string", "minLength": 1, "maxLength": 24}
COUNT = {"type": "integer", "minimum": 0, "maximum": 9999}  # a range bounds the digits
SIGNED = {"type": "number", "minimum": -1000, "maximum": 1000}

SCHEMAS: dict[str, tuple[dict, object]] = {
    "integer": (COUNT, 42),
    "boolean": ({"type": "boolean"}, True),
    "enum": ({"enum": ["red", "green", "blue"]}, "green"),
    "short_string": (NAME, "Ada"),
    "person": (
        {
            "type": "object",
            "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        {"name": "Ada", "age": 36},
    ),
    "point": (
        {
            "type": "object",
            "properties": {"x": SIGNED, "y": SIGNED},
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        {"x": 1.5, "y": -2},
    ),
    "tags": ({"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}, ["a", "b"]),
    "numbers": ({"type": "array", "items": COUNT, "maxItems": 4}, [1, 2, 3]),
    "nested": (
        {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {"id": COUNT, "name": NAME},
                    "required": ["id", "name"],
                    "additionalProperties": False,
                }
            },
            "required": ["user"],
            "additionalProperties": False,
        },
        {"user": {"id": 7, "name": "Lin"}},
    ),
    "optional_field": (
        {
            "type": "object",
            "properties": {"title": NAME, "note": NAME},
            "required": ["title"],
            "additionalProperties": False,
        },
        {"title": "x"},
    ),
    "enum_object": (
        {
            "type": "object",
            "properties": {"status": {"enum": ["ok", "error"]}, "code": COUNT},
            "required": ["status", "code"],
            "additionalProperties": False,
        },
        {"status": "ok", "code": 200},
    ),
    "nullable": ({"type": ["string", "null"], "maxLength": 16}, None),
    "any_of": ({"anyOf": [COUNT, {"type": "boolean"}]}, False),
    "const": ({"const": "yes"}, "yes"),
    "pattern": ({"type": "string", "pattern": "^[a-z]{2,6}$"}, "abc"),
    "date_like": ({"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}, "2026-12-07"),
    "bounded_number": ({"type": "number", "minimum": 0, "maximum": 1}, 0.5),
    "array_of_objects": (
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"k": NAME, "v": COUNT},
                "required": ["k", "v"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 2,
        },
        [{"k": "a", "v": 1}],
    ),
    "tuple": (
        {"type": "array", "prefixItems": [COUNT, NAME], "items": False, "minItems": 2},
        [3, "x"],
    ),
    "ref": (
        {
            "$defs": {"item": {"type": "object", "properties": {"n": COUNT}, "required": ["n"]}},
            "type": "object",
            "properties": {"first": {"$ref": "#/$defs/item"}},
            "required": ["first"],
            "additionalProperties": False,
        },
        {"first": {"n": 1}},
    ),
    "weather_call": (
        {
            "type": "object",
            "properties": {"city": NAME, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        {"city": "Paris", "unit": "celsius"},
    ),
    "flags": (
        {
            "type": "object",
            "properties": {"a": {"type": "boolean"}, "b": {"type": "boolean"}, "c": {"type": "boolean"}},
            "required": ["a", "b", "c"],
            "additionalProperties": False,
        },
        {"a": True, "b": False, "c": True},
    ),
}
