# Vendored from the OpenAI Agents SDK (openai-agents 0.24.0, source distribution),
# tests/test_responses.py (get_text_message only, unchanged).
# Copyright (c) 2025 OpenAI. SPDX-License-Identifier: MIT (the SDK's LICENSE, whole, is beside this file).
"""The model output the SDK's session tests script: an assistant's text message."""

from __future__ import annotations

from openai.types.responses import ResponseOutputItem, ResponseOutputMessage, ResponseOutputText


def get_text_message(content: str) -> ResponseOutputItem:
    return ResponseOutputMessage(
        id="1",
        type="message",
        role="assistant",
        content=[ResponseOutputText(text=content, type="output_text", annotations=[], logprobs=[])],
        status="completed",
    )
