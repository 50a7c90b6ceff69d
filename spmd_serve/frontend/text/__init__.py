"""Text handling of the front end: the serving tokenizer (`tokenizer`, over PaddleNLP or a
HuggingFace `tokenizer.json` via `hf_tokenizer`), chat templates (`chat_template`), streaming
detokenization (`detokenizer`) and stop-string cutting of output text (`output_assembler`).

Imports nothing else from the front end: no protocol, no tornado, no engine.
"""
