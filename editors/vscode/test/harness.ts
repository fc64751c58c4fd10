/** Test helpers: where the repository and its Python are, and the real `draftline serve` over stdio. */
import { ChildProcess, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { Launch } from '../src/settings';
import { MessageConnection, StreamMessageReader, StreamMessageWriter, createMessageConnection } from 'vscode-jsonrpc/node';

export const EXTENSION_DIR = path.resolve(__dirname, '..', '..'); // out/test -> editors/vscode
export const REPO = path.resolve(EXTENSION_DIR, '..', '..');

/** The Python that runs the server: $DRAFTLINE_PY, else the repository's .venv. */
export function python(): string | undefined {
  const candidates = [process.env.DRAFTLINE_PY, path.join(REPO, '.venv', 'bin', 'python')];
  return candidates.find((p): p is string => !!p && fs.existsSync(p));
}

/** The server's environment, as tests/editors/conftest.py builds it: no user TOML, a throwaway cache. */
export function serverEnv(): NodeJS.ProcessEnv {
  const tmp = os.tmpdir();
  const pythonPath = [REPO, process.env.PYTHONPATH].filter(Boolean).join(path.delimiter);
  return {
    ...process.env,
    PYTHONPATH: pythonPath,
    DRAFTLINE_CACHE_DIR: path.join(tmp, 'draftline-vscode-test-cache'),
    XDG_CONFIG_HOME: path.join(tmp, 'draftline-vscode-test-noconfig'),
  };
}

/**
 * The real `draftline` executable (what the extension's `draftline.server.command` names):
 * $DRAFTLINE_CMD, else the `draftline` beside the Python above (a virtualenv's bin/), else on PATH.
 */
export function draftlineCommand(): string | undefined {
  if (process.env.DRAFTLINE_CMD) return fs.existsSync(process.env.DRAFTLINE_CMD) ? process.env.DRAFTLINE_CMD : undefined;
  const py = python();
  const beside = py ? path.join(path.dirname(py), 'draftline') : undefined;
  if (beside && fs.existsSync(beside)) return beside;
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    const candidate = dir && path.join(dir, 'draftline');
    if (candidate && fs.existsSync(candidate)) return candidate;
  }
  return undefined;
}

export interface Server {
  proc: ChildProcess;
  connection: MessageConnection;
  stderr: () => string;
  exited: Promise<number | null>;
}

/**
 * Spawn the server exactly as the extension's ServerOptions say (`serverLaunch`: command, args, env)
 * and connect vscode-jsonrpc to its stdio.
 */
export function startServer(launch: Launch, cwd: string): Server {
  const proc = spawn(launch.command, launch.args, { cwd, env: launch.env, stdio: 'pipe' });
  let err = '';
  proc.stderr!.on('data', (chunk: Buffer) => (err += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => proc.on('exit', (code) => resolve(code)));
  const connection = createMessageConnection(new StreamMessageReader(proc.stdout!), new StreamMessageWriter(proc.stdin!));
  return { proc, connection, stderr: () => err, exited };
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Poll until `predicate(value)` holds or the deadline passes (then fail with the last value). */
export async function until<T>(get: () => Promise<T>, predicate: (value: T) => boolean, deadlineMs = 30000): Promise<T> {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const value = await get();
    if (predicate(value)) return value;
    if (Date.now() > end) throw new Error(`condition never held; last value: ${JSON.stringify(value)}`);
    await sleep(50);
  }
}
