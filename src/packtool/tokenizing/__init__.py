"""Tokenizing: text -> tokens, shared by the encoders and the vision processor (both above it).

``tokenizer.HFTokenizer`` is a Hugging Face tokenizer as packtool calls it; ``chat_template.ChatTemplate``
renders a conversation with a chat template, within a budget (``template_sandbox``, ``template_sizes``),
and finds the characters of its trained turns. This file imports nothing.
"""
