// Bundle the queue page: src/main.ts (with the TypeScript client's sources, imported from
// ../typescript/src, and eventsource-parser from that project's node_modules) into app.js,
// src/app.css into app.css, and copy src/index.html. Deterministic: the same sources and
// pinned esbuild give the same bytes, which tests/test_ui.py checks against the committed
// bundle in src/prompt_outbox/ui/static/.
//
//   node scripts/build.mjs [OUT_DIR]     (default: ../../src/prompt_outbox/ui/static)
import { copyFile, mkdir } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const out = resolve(process.argv[2] ?? join(here, "..", "..", "src", "prompt_outbox", "ui", "static"));

await mkdir(out, { recursive: true });
await build({
  absWorkingDir: here,
  entryPoints: { app: "src/main.ts" },
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  outdir: out,
  charset: "utf8",
  legalComments: "none",
  logLevel: "warning",
});
await build({
  absWorkingDir: here,
  entryPoints: { app: "src/app.css" },
  bundle: true,
  outdir: out,
  charset: "utf8",
  logLevel: "warning",
});
await copyFile(join(here, "src", "index.html"), join(out, "index.html"));
