# A token file: one row per client; the token is what it sends as `Authorization: Bearer`.
cat > tokens.json <<'EOF'
{"tokens": [
  {"token": "dev-token-change-me", "user": "me", "workspaces": ["acme"], "admin": false}
]}
EOF
export PROMPT_OUTBOX_WEBHOOK_SECRET=dev-secret-change-me  # signs each delivery to the agent
python examples/webhook_agent.py 9000 &  # a stand-in agent: prints what it gets
prompt-outbox serve --tokens tokens.json --port 8080 --webhook-url http://127.0.0.1:9000/ &
until curl -sf http://127.0.0.1:8080/readyz; do sleep 0.2; done  # the embedded Valkey starts

# Accept a prompt: 202 {"id": ..., "status": "pending"}; the same clientMessageID again is
# answered 200 {"duplicate": true}, so a client that lost the answer just sends it again.
curl -s http://127.0.0.1:8080/v1/workspaces/acme/sessions/chat-1/prompts \
  -H 'Authorization: Bearer dev-token-change-me' -H 'Content-Type: application/json' \
  -d '{"clientMessageID": "msg-1", "text": "Hello, agent!"}'

# Watch the session's queue change (server-sent events; Ctrl-C, or here 3 seconds).
curl -N -m 3 http://127.0.0.1:8080/v1/workspaces/acme/sessions/chat-1/events \
  -H 'Authorization: Bearer dev-token-change-me'
