"""The real llama-server: the process, its own delimiters, its log, a session through its chat endpoint.

- `process`: request bodies for `/completion`, the server process and its log file;
- `pins`: the llama-cpp-python releases llama-server is built from;
- `log`: a user's llama-server log read (`read_server_log`), its prompt batches and checkpoints;
- `log_breaks`: those breaks placed on the session the server was sent (`locate_breaks`);
- `chat_session`: a session driven request by request through the chat endpoint (`drive_session`);
- `resume`: what the server recomputes per request, predicted against measured (`check_resume`);
- `delimiters`: the chat endpoint's delimiters read off the server (`server_delimiters`);
- `delimiter_comparison`: those against tmplkit's (`compare_delimiters`);
- `parity`: llama.cpp's own renderer against tmplkit's (`tmplkit engine-parity`).

Nothing is imported here: each module loads what it needs (a server, llama-cpp-python) on use.
"""
