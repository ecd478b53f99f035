// One load run for bench/http.py: POSTs at an accept route, each with a clientMessageID of its
// own (the same one twice would be a duplicate, not an accept) and a new session every
// `perSession` requests (a session holds at most 25 entries). Prints one JSON line.
'use strict'

const autocannon = require('autocannon')

const cfg = JSON.parse(process.argv[2])
let n = 0

const result = autocannon({
  url: cfg.url,
  connections: cfg.connections,
  duration: cfg.seconds,
  timeout: 10,
  requests: [{
    method: 'POST',
    headers: cfg.headers,
    setupRequest: (req) => {
      const i = n++
      req.path = `/v1/workspaces/${cfg.workspace}/sessions/s${Math.floor(i / cfg.perSession)}/prompts`
      req.body = JSON.stringify({ clientMessageID: `${cfg.tag}-${i}`, text: cfg.text, model: cfg.model })
      return req
    }
  }]
}, (err, res) => {
  if (err) {
    console.error(err)
    process.exit(1)
  }
  const codes = {}
  for (const [code, stat] of Object.entries(res.statusCodeStats || {})) codes[code] = stat.count
  console.log(JSON.stringify({
    seconds: res.duration,
    ok: res['2xx'],
    non2xx: res.non2xx,
    errors: res.errors,
    timeouts: res.timeouts,
    codes,
    p50: res.latency.p50,
    p99: res.latency.p99,
    sent: n
  }))
})
