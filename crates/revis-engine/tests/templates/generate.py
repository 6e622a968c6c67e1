#!/usr/bin/env python3
"""Regenerate the reference renderings in this directory.

Renders every template (`<T>.jinja`) against every case with Hugging Face
transformers' own chat-template code, doing what
`PreTrainedTokenizerBase.apply_chat_template(..., tokenize=False)` does:

  1. `_normalize_chat_messages` (keys whose value is None are dropped, so
     `"content": null` renders as if the key were absent);
  2. `render_jinja_template(conversations=[messages], tools=tools,
     documents=None, add_generation_prompt=..., **special_tokens)`, which
     compiles the template with `_compile_jinja_template` (jinja2
     ImmutableSandboxedEnvironment, trim_blocks=True, lstrip_blocks=True,
     loopcontrols; `tojson` = json.dumps(ensure_ascii=False, ...);
     `raise_exception`, `strftime_now`) and always passes `tools` and
     `documents` (None when not given).

The only change to transformers is `strftime_now`: its clock is pinned to
2026-12-04 00:00:00 so outputs are deterministic.

Writes cases.json (from CASES below), then `<T>.<case>.txt` (the exact
rendered string, no newline added) or `<T>.<case>.error` (the exception
message) for every template and case. Old .txt/.error files are removed first.

Usage:  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers jinja2
        /tmp/venv/bin/python generate.py
"""

import datetime as _dt
import json
import sys
from pathlib import Path

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

HERE = Path(__file__).resolve().parent

FIXED_NOW = _dt.datetime(2026, 12, 4)


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW if tz is None else FIXED_NOW.replace(tzinfo=tz)


# strftime_now inside _cached_compile_jinja_template calls the module-level
# `datetime.now()`; pin it (and drop any already compiled templates).
ctu.datetime = _FixedDatetime
ctu._compile_jinja_template.cache_clear()

# The special tokens each model's tokenizer passes to its template
# (apply_chat_template passes tokenizer.special_tokens_map; a token the
# tokenizer lacks is not passed at all, so the template sees it undefined).
SPECIAL_TOKENS = {
    "qwen2.5": {"eos_token": "<|im_end|>"},
    "llama3.1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mistral": {"bos_token": "<s>", "eos_token": "</s>"},
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<eos>"},
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city, e.g. Zürich or 東京",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Get the current local time in an IANA time zone",
            "parameters": {
                "type": "object",
                "properties": {
                    "timezone": {"type": "string", "description": "IANA time zone, e.g. Europe/Paris"},
                },
                "required": ["timezone"],
            },
        },
    },
]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def tool_round(assistant_content):
    return [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": assistant_content,
            "tool_calls": [
                {
                    "id": "call00001",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "{\"temp_c\": 18}"},
    ]


CASES = [
    {
        "name": "plain",
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Hello! Grüße, 東京"},
            {"role": "assistant", "content": "Hi there. How can I help?"},
            {"role": "user", "content": "What is 2 + 2?"},
        ],
        "tools": None,
        "add_generation_prompt": True,
    },
    {
        "name": "no_system",
        "messages": [
            {"role": "user", "content": "Hello!"},
            {"role": "assistant", "content": "Hi there. How can I help?"},
            {"role": "user", "content": "What is 2 + 2?"},
        ],
        "tools": None,
        "add_generation_prompt": True,
    },
    {
        "name": "single",
        "messages": [{"role": "user", "content": "Hello!"}],
        "tools": None,
        "add_generation_prompt": True,
    },
    {
        "name": "closed",
        "messages": [
            SYSTEM,
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4"},
        ],
        "tools": None,
        "add_generation_prompt": False,
    },
    {
        "name": "tools",
        "messages": [SYSTEM, {"role": "user", "content": "What is the weather in Paris?"}],
        "tools": TOOLS,
        "add_generation_prompt": True,
    },
    {
        "name": "tool_round",
        "messages": tool_round(""),
        "tools": TOOLS,
        "add_generation_prompt": True,
    },
    {
        # Same as tool_round with the assistant's content null: transformers
        # drops None-valued keys before rendering, so the template sees no
        # `content` key at all on that message.
        "name": "tool_round_null",
        "messages": tool_round(None),
        "tools": TOOLS,
        "add_generation_prompt": True,
    },
]


def render(template, case, special_tokens):
    messages = ctu._normalize_chat_messages(case["messages"])
    rendered, _ = ctu.render_jinja_template(
        conversations=[messages],
        tools=case["tools"],
        documents=None,
        chat_template=template,
        add_generation_prompt=case["add_generation_prompt"],
        **special_tokens,
    )
    return rendered[0]


def main():
    (HERE / "cases.json").write_text(json.dumps(CASES, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    # Render from the file just written, exactly what the Rust tests read.
    cases = json.loads((HERE / "cases.json").read_text(encoding="utf-8"))
    for old in list(HERE.glob("*.txt")) + list(HERE.glob("*.error")):
        old.unlink()
    for name, special_tokens in SPECIAL_TOKENS.items():
        with open(HERE / f"{name}.jinja", encoding="utf-8", newline="") as f:
            template = f.read()
        for case in cases:
            stem = f"{name}.{case['name']}"
            try:
                out = render(template, case, special_tokens)
            except Exception as e:  # noqa: BLE001 - record whatever the template raises
                (HERE / f"{stem}.error").write_bytes(str(e).encode("utf-8"))
                print(f"{stem}: {type(e).__name__}: {e}")
            else:
                (HERE / f"{stem}.txt").write_bytes(out.encode("utf-8"))
    print(f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}, python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
