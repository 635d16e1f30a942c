"""JSON schemas for the constrained-decoding tests, each with a request: nested objects, arrays with bounds,
enums, numbers with ranges, optional fields, $ref/$defs, anyOf, const, patterns, and requests the model would
rather answer in prose (a story, a poem, code) than in JSON."""
from __future__ import annotations

_PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                            "age": {"type": "integer", "minimum": 0, "maximum": 120}},
           "required": ["name", "age"], "additionalProperties": False}

SCHEMAS: list[tuple[str, dict]] = [
    ("Invent a person.", _PERSON),
    ("Tell me a long story about a dragon who loves tea.", _PERSON),
    ("Give me a color.", {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                          "required": ["color"]}),
    ("Rate this movie from 1 to 5: 'It was fine.'",
     {"type": "object", "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5},
                                       "reason": {"type": "string", "maxLength": 80}},
      "required": ["stars"], "additionalProperties": False}),
    ("List three fruits.", {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 3,
                            "maxItems": 3}),
    ("Write a poem about the sea.", {"type": "object", "properties": {"title": {"type": "string", "maxLength": 60},
                                                                      "lines": {"type": "array", "maxItems": 4,
                                                                                "items": {"type": "string",
                                                                                          "maxLength": 60}}},
                                     "required": ["title", "lines"], "additionalProperties": False}),
    ("Describe a city.", {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30},
        "population": {"type": "integer", "minimum": 0},
        "location": {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                                      "lon": {"type": "number", "minimum": -180, "maximum": 180}},
                     "required": ["lat", "lon"], "additionalProperties": False}},
        "required": ["name", "population", "location"], "additionalProperties": False}),
    ("Is water wet?", {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"],
                       "additionalProperties": False}),
    ("Give a temperature in Celsius.", {"type": "object", "properties": {
        "celsius": {"type": "number", "minimum": -50, "maximum": 60}}, "required": ["celsius"],
        "additionalProperties": False}),
    ("Write a Python function that adds two numbers.",
     {"type": "object", "properties": {"language": {"const": "python"}, "code": {"type": "string", "maxLength": 200}},
      "required": ["language", "code"], "additionalProperties": False}),
    ("Make a to-do list.", {"type": "object", "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 4,
                                                                       "items": {"$ref": "#/$defs/task"}}},
                            "required": ["items"], "additionalProperties": False,
                            "$defs": {"task": {"type": "object", "properties": {
                                "title": {"type": "string", "maxLength": 40}, "done": {"type": "boolean"}},
                                "required": ["title", "done"], "additionalProperties": False}}}),
    ("Describe a family of two.", {"type": "object", "properties": {"members": {
        "type": "array", "items": {"$ref": "#/$defs/person"}, "minItems": 2, "maxItems": 2}},
        "required": ["members"], "additionalProperties": False, "$defs": {"person": _PERSON}}),
    ("Give me an ID.", {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
                        "required": ["id"], "additionalProperties": False}),
    ("What is 2 + 2?", {"type": "object", "properties": {"result": {"type": "integer"}}, "required": ["result"],
                        "additionalProperties": False}),
    ("Pick a size.", {"type": "object", "properties": {"size": {"enum": ["S", "M", "L", "XL"]},
                                                       "quantity": {"type": "integer", "minimum": 1, "maximum": 10}},
                      "required": ["size", "quantity"], "additionalProperties": False}),
    ("Tell me about yourself.", {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30}, "nickname": {"type": "string", "maxLength": 20},
        "email": {"type": "string", "maxLength": 40}}, "required": ["name"], "additionalProperties": False}),
    ("Give a value that is a number or a word.", {"type": "object", "properties": {
        "value": {"anyOf": [{"type": "number"}, {"type": "string", "maxLength": 20}]}}, "required": ["value"],
        "additionalProperties": False}),
    ("Say nothing useful.", {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 30}},
                             "required": ["note"], "additionalProperties": False}),
    ("Give me a 3x3 grid of digits.", {"type": "array", "minItems": 3, "maxItems": 3, "items": {
        "type": "array", "minItems": 3, "maxItems": 3, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}),
    ("Write an essay on the history of Rome.", {"type": "object", "properties": {
        "summary": {"type": "string", "maxLength": 100},
        "centuries": {"type": "array", "items": {"type": "integer", "minimum": -8, "maximum": 21}, "maxItems": 5}},
        "required": ["summary", "centuries"], "additionalProperties": False}),
    ("Book a flight.", {"type": "object", "properties": {
        "from": {"type": "string", "pattern": "^[A-Z]{3}$"}, "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "date": {"type": "string", "pattern": "^2[0-9]{3}-[01][0-9]-[0-3][0-9]$"},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["from", "to", "date", "passengers"], "additionalProperties": False}),
    ("Call a tool to get the weather in Paris.", {"type": "object", "properties": {
        "tool": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                       "unit": {"enum": ["celsius", "fahrenheit"]}},
                      "required": ["city", "unit"], "additionalProperties": False}},
        "required": ["tool", "arguments"], "additionalProperties": False}),
    ("Classify the sentiment: 'I love this!'", {"type": "object", "properties": {
        "label": {"enum": ["positive", "negative", "neutral"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["label", "confidence"], "additionalProperties": False}),
    ("Give me some tags.", {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"enum": ["news", "sports", "tech", "art"]}, "minItems": 1, "maxItems": 3}}, "required": ["tags"], "additionalProperties": False}),
    ("Describe a product.", {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30}, "price": {"type": "number", "minimum": 0, "maximum": 10000},
        "in_stock": {"type": "boolean"}, "dimensions": {"type": "object", "properties": {
            "w": {"type": "number", "minimum": 0, "maximum": 1000}, "h": {"type": "number", "minimum": 0,
                                                                          "maximum": 1000}},
            "required": ["w", "h"], "additionalProperties": False}},
        "required": ["name", "price", "in_stock"], "additionalProperties": False}),
    ("Write a haiku.", {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 3,
                        "maxItems": 3}),
    ("Translate 'hello' to French and Spanish.", {"type": "object", "properties": {
        "fr": {"type": "string", "maxLength": 20}, "es": {"type": "string", "maxLength": 20}},
        "required": ["fr", "es"], "additionalProperties": False}),
    ("Give coordinates of two points.", {"type": "object", "properties": {"points": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {"$ref": "#/$defs/pt"}}},
        "required": ["points"], "additionalProperties": False,
        "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -100, "maximum": 100},
                                                          "y": {"type": "integer", "minimum": -100, "maximum": 100}},
                         "required": ["x", "y"], "additionalProperties": False}}}),
    ("Explain quantum physics in detail.", {"type": "object", "properties": {
        "difficulty": {"type": "integer", "minimum": 1, "maximum": 10}, "one_word": {"type": "string",
                                                                                     "pattern": "^[a-z]{1,12}$"}},
        "required": ["difficulty", "one_word"], "additionalProperties": False}),
    ("Give me an HTTP status.", {"type": "object", "properties": {
        "code": {"type": "integer", "minimum": 100, "maximum": 599}, "ok": {"type": "boolean"}},
        "required": ["code", "ok"], "additionalProperties": False}),
    ("Make a recipe.", {"type": "object", "properties": {
        "dish": {"type": "string", "maxLength": 40},
        "ingredients": {"type": "array", "minItems": 2, "maxItems": 4, "items": {"type": "object", "properties": {
            "item": {"type": "string", "maxLength": 20}, "grams": {"type": "integer", "minimum": 1, "maximum": 1000}},
            "required": ["item", "grams"], "additionalProperties": False}}},
        "required": ["dish", "ingredients"], "additionalProperties": False}),
    ("Any JSON object will do.", {"type": "object", "maxProperties": 3, "additionalProperties": {"type": "integer"}}),
    ("Give a version number.", {"type": "object", "properties": {"version": {
        "type": "string", "pattern": "^[0-9]{1,2}\\.[0-9]{1,2}\\.[0-9]{1,2}$"}}, "required": ["version"],
        "additionalProperties": False}),
]
