"""Golden data for chat templates (scalelab generate --chat; src/model/tokenizer/chat_template.h).

Renders every template of data/chat/templates/ for every conversation below, with and without
add_generation_prompt, as transformers' apply_chat_template does (tokenize=False for the text,
tokenize=True for the ids, with the SmolLM-style test tokenizer of data/tokenizer/smollm_style,
whose special tokens are <|endoftext|>, <|im_start|> and <|im_end|>). A template that raises
records the error instead. Writes data/chat/expected.json:

  {"special_tokens": {...}, "conversations": {name: {"messages": [...], "tools": [...]?}},
   "cases": [{"template", "conversation", "add_generation_prompt", "text", "ids"} or {..., "error"}]}

Run through make_chat_golden.sh (pinned virtualenv, requirements-chat.txt).
"""
import argparse
import json
import os

from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))

CONVERSATIONS = {
    "user_only": {"messages": [{"role": "user", "content": "What is the Apache License?"}]},
    "system_user": {
        "messages": [
            {"role": "system", "content": "  You answer briefly.  "},
            {"role": "user", "content": "Name two permissive licenses."},
        ]
    },
    "multi_turn": {
        "messages": [
            {"role": "user", "content": "Hello!\nHow are you?  "},
            {"role": "assistant", "content": "Fine, thanks. Ça va? 中文 🙂"},
            {"role": "user", "content": "  Tell me a  joke\twith tabs. "},
        ]
    },
    "system_multi": {
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "One?"},
            {"role": "assistant", "content": "Two."},
            {"role": "user", "content": "Three?"},
        ]
    },
    "empty_content": {"messages": [{"role": "user", "content": ""}]},
    "tool_use": {
        "messages": [
            {"role": "user", "content": "What's the weather in Paris and Oslo?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}},
                ],
            },
            {"role": "tool", "content": "{\"temperature\": 21.5}"},
            {"role": "tool", "content": "{\"temperature\": -3}"},
            {"role": "assistant", "content": "Paris: 21.5 °C, Oslo: −3 °C."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "The current weather in a city.",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "description": "The city"},
                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                        },
                        "required": ["city"],
                    },
                },
            }
        ],
    },
}

SPECIAL = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tdir = os.path.join(args.out, "templates")
    tok = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(HERE, "data", "tokenizer", "smollm_style", "tokenizer.json"), **SPECIAL
    )
    assert tok.special_tokens_map == SPECIAL, tok.special_tokens_map
    cases = []
    for fname in sorted(os.listdir(tdir)):
        if not fname.endswith(".jinja"):
            continue
        with open(os.path.join(tdir, fname), encoding="utf-8", newline="") as f:
            template = f.read()
        name = fname[: -len(".jinja")]
        for conv_name, conv in CONVERSATIONS.items():
            for agp in (True, False):
                case = {"template": name, "conversation": conv_name, "add_generation_prompt": agp}
                kw = dict(chat_template=template, add_generation_prompt=agp, tools=conv.get("tools"))
                try:
                    case["text"] = tok.apply_chat_template(conv["messages"], tokenize=False, **kw)
                    case["ids"] = tok.apply_chat_template(conv["messages"], tokenize=True, **kw)
                    assert case["ids"] == tok(case["text"], add_special_tokens=False)["input_ids"]
                except Exception as e:  # the template refuses the conversation (raise_exception, undefined)
                    case.pop("text", None)
                    case["error"] = str(e)
                    case["error_type"] = type(e).__name__
                cases.append(case)
    out = {"special_tokens": SPECIAL, "conversations": CONVERSATIONS, "cases": cases}
    path = os.path.join(args.out, "expected.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"wrote {path}: {len(cases)} cases, {sum('error' in c for c in cases)} refused by their template")


if __name__ == "__main__":
    main()
