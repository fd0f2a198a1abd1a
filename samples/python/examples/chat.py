#!/usr/bin/env python3
"""A multi-turn chat with the engine, streamed as it is written.

    python samples/python/examples/chat.py [--endpoint ENDPOINT] [--max-tokens N]

Reads lines from stdin (one user turn each); an empty line or EOF ends it.
Ctrl-C while the answer streams cancels that answer.
"""
import argparse
import sys

from rtx_localai import EngineConnectionError, RTXLocalAIClient, RTXLocalAIError


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", help="ipc://PATH, tcp://HOST:PORT or unix://PATH (default: the engine's default)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--system", default=None, help="a system message")
    args = ap.parse_args()
    try:
        ai = RTXLocalAIClient(args.endpoint)
    except EngineConnectionError as e:
        print(f"chat: {e}", file=sys.stderr)
        return 1
    history = [{"role": "system", "content": args.system}] if args.system else []
    with ai:
        print(f"connected to {ai.info.get('engine')} ({ai.info.get('model')}); empty line to quit", file=sys.stderr)
        for line in sys.stdin:
            line = line.strip()
            if not line:
                break
            history.append({"role": "user", "content": line})
            stream = ai.chat(history, stream=True, max_tokens=args.max_tokens)
            try:
                for piece in stream:
                    print(piece, end="", flush=True)
            except KeyboardInterrupt:
                stream.close()  # cancels and drains
            except RTXLocalAIError as e:
                print(f"\nchat: {e}", file=sys.stderr)
                history.pop()
                continue
            print()
            history.append({"role": "assistant", "content": stream.text})
            m = stream.metrics
            if m:
                print(f"[{stream.stop}: {m.gen_tokens} tokens, ttft {m.ttft_ms:.0f} ms, "
                      f"{m.decode_tps:.1f} tok/s, {m.reused_tokens}/{m.prompt_tokens} prompt tokens reused]",
                      file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
