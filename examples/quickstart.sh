# A token file: one row per client, which sends its token as `Authorization: Bearer`. A
# workspace is a tenant (a team, a customer), a session one agent conversation in it, and
# `user` is who this token's prompts are recorded as.
cat > tokens.json <<'EOF'
{"tokens": [
  {"token": "dev-token-change-me", "user": "me", "workspaces": ["acme"], "admin": false}
]}
EOF
chmod 600 tokens.json  # a secret: serve warns if others may read it
export PROMPT_OUTBOX_WEBHOOK_SECRET=dev-secret-change-me  # signs each delivery to the agent
python examples/webhook_agent.py 9000 &  # a stand-in agent: prints what it gets
prompt-outbox serve --tokens tokens.json --port 8080 --webhook-url http://127.0.0.1:9000/ &
until curl -sfo /dev/null http://127.0.0.1:8080/readyz; do  # the embedded Valkey starts
  kill -0 $! 2>/dev/null || { echo "serve did not start: see its error above"; break; }
  sleep 0.2
done

# Follow the session's queue as it changes (server-sent events), here for 3 seconds.
curl -sN -m 3 http://127.0.0.1:8080/v1/workspaces/acme/sessions/chat-1/events \
  -H 'Authorization: Bearer dev-token-change-me' &
sleep 1  # the stream opens

# Accept a prompt: 202 {"id": ..., "status": "pending", "duplicate": false}; the same
# clientMessageID again is answered 200 {"id": <the same>, "duplicate": true}, so a client
# that lost the answer just sends it again.
curl -s -w '\n' http://127.0.0.1:8080/v1/workspaces/acme/sessions/chat-1/prompts \
  -H 'Authorization: Bearer dev-token-change-me' -H 'Content-Type: application/json' \
  -d '{"clientMessageID": "msg-1", "text": "Hello, agent!"}'
wait $!  # the stream: queue.reset (the queue), then a queue.update for each change;
# it ends with curl's "Exit 28": the -m 3 limit, not an error
