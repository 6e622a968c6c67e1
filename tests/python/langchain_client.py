"""A third-party framework: LangChain's `langchain-openai` against `revis
serve`'s /v1, unchanged but for its base URL and key: tools bound to the
model, and structured output through a function call.

Usage: python3 langchain_client.py BASE_URL API_KEY MODEL
Prints one JSON object with what it saw; exits non-zero on any failure.
"""
import json
import sys

import pydantic
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


# Bounded strings, so a call always fits max_tokens whatever the model writes.
class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=24)


@tool(args_schema=City)
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return "18 C"


class Capital(pydantic.BaseModel):
    """A country's capital city."""

    country: str = pydantic.Field(max_length=24)
    capital: str = pydantic.Field(max_length=24)


def main() -> None:
    base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    llm = ChatOpenAI(base_url=f"{base}/v1", api_key=key, model=model, temperature=0, max_tokens=128, max_retries=0, timeout=120)
    out = {}
    m = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    out["bind_tools"] = [{"name": c["name"], "args": c["args"], "id": bool(c["id"])} for c in m.tool_calls]
    r = llm.with_structured_output(Capital, method="function_calling").invoke("What is the capital of France?")
    out["structured"] = {"type": type(r).__name__, "fields": sorted(r.model_dump())}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
