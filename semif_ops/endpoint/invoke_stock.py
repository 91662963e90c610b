"""Ask the stock llama.cpp DLC endpoint (semif-ops endpoint deploy --stock) one chat question, OpenAI style.

semif-ops endpoint invoke --stock --endpoint llamacpp-qwen --prompt "Answer A or B: ..."
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from semif_ops.endpoint import invoke
from semif_ops.errors import OperationFailed
from semif_ops.exits import command


def chat_payload(prompt: str, *, system: str | None, max_tokens: int, temperature: float) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}
    ]
    return {"messages": messages, "max_tokens": max_tokens, "temperature": temperature}


@command
def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    invoke.add_runtime_arguments(parser)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--system")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--raw", action="store_true", help="print the whole response JSON")
    args = parser.parse_args(argv)
    payload = chat_payload(
        args.prompt, system=args.system, max_tokens=args.max_tokens, temperature=args.temperature
    )
    response = invoke.invoke_with_retry(
        invoke.runtime_client(args),
        endpoint=args.endpoint,
        body=json.dumps(payload).encode(),
        max_attempts=args.max_attempts,
        base_s=args.base_delay,
        cap_s=args.max_delay,
    )
    try:
        answer = json.loads(response["Body"])
        text = answer["choices"][0]["message"]["content"]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError):
        raise OperationFailed(f"unexpected response: {response['Body'][:500]!r}") from None
    print(json.dumps(answer, indent=2) if args.raw else text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
