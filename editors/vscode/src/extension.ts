/**
 * The VS Code side of draftline: starts `draftline serve`, keeps its settings in sync, shows its
 * status, and offers toggle / status / restart. Inline completion itself is vscode-languageclient's.
 */
import * as os from 'node:os';
import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
} from 'vscode-languageclient/node';
import {
  LaunchPlace,
  Settings,
  clientConfig,
  didChangeConfigurationParams,
  enabledFor,
  needsRestart,
  readSettings,
  serverLaunch,
} from './settings';
import { STATUS_METHOD, STATUS_PARAMS, ServerStatus, statusView } from './status';

const SECTION = 'draftline';
/** How long *Show Status* waits for the server's draftline/status before it shows what it has. */
const SHOW_STATUS_WAIT_MS = 1000;

/** The settings a running server process keeps until it is restarted (its command line, env and documents). */
const LAUNCH_KEYS = ['server.command', 'server.args', 'server.env', 'languages'] as const;

function subset<T extends object, K extends keyof T>(from: T, keys: readonly K[]): Pick<T, K> {
  return Object.fromEntries(keys.map((k) => [k, from[k]])) as Pick<T, K>;
}

function currentSettings(): Settings {
  const config = vscode.workspace.getConfiguration(SECTION);
  return readSettings((key) => config.get(key));
}

/** Where relative paths and `${workspaceFolder}` in the server settings point: the first folder on disk, if any. */
function launchPlace(): LaunchPlace {
  const folder = vscode.workspace.workspaceFolders?.find((f) => f.uri.scheme === 'file');
  return { home: os.homedir(), workspaceFolder: folder?.uri.fsPath };
}

/**
 * The output channel as vscode-languageclient's trace channel. The client traces only while that channel's log level is
 * Trace (client.js refreshTrace: otherwise the trace is Off whatever `draftline.trace.server` says) and writes each
 * line with channel.trace(), which a channel at the default Info level drops: so the setting alone showed nothing.
 * This view reports Trace while the setting asks for a trace and writes the lines at info level then; with the
 * setting off it is the channel itself (its own log level, set to Trace by hand, still traces, as in the client).
 */
class TraceChannel implements vscode.LogOutputChannel {
  private readonly changed = new vscode.EventEmitter<vscode.LogLevel>();
  readonly onDidChangeLogLevel = this.changed.event;
  private readonly listener: vscode.Disposable;

  constructor(
    private readonly output: vscode.LogOutputChannel,
    private traced: boolean,
  ) {
    this.listener = output.onDidChangeLogLevel(() => this.changed.fire(this.logLevel));
  }

  /** `draftline.trace.server` changed: a level change makes the client re-read the setting (hookLogLevelChanged). */
  setTraced(traced: boolean): void {
    if (traced === this.traced) return;
    this.traced = traced;
    this.changed.fire(this.logLevel);
  }

  get name(): string {
    return this.output.name;
  }
  get logLevel(): vscode.LogLevel {
    return this.traced ? vscode.LogLevel.Trace : this.output.logLevel;
  }
  trace(message: string, ...args: any[]): void {
    if (this.traced) this.output.info(message, ...args);
    else this.output.trace(message, ...args);
  }
  debug(message: string, ...args: any[]): void {
    this.output.debug(message, ...args);
  }
  info(message: string, ...args: any[]): void {
    this.output.info(message, ...args);
  }
  warn(message: string, ...args: any[]): void {
    this.output.warn(message, ...args);
  }
  error(error: string | Error, ...args: any[]): void {
    this.output.error(error, ...args);
  }
  append(value: string): void {
    this.output.append(value);
  }
  appendLine(value: string): void {
    this.output.appendLine(value);
  }
  replace(value: string): void {
    this.output.replace(value);
  }
  clear(): void {
    this.output.clear();
  }
  show(column?: vscode.ViewColumn | boolean, preserveFocus?: boolean): void {
    if (typeof column === 'boolean') this.output.show(column);
    else this.output.show(column, preserveFocus);
  }
  hide(): void {
    this.output.hide();
  }
  dispose(): void {
    this.listener.dispose();
    this.changed.dispose();
  }
}

class Draftline implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private starting: Promise<void> = Promise.resolve();
  private started: Settings | undefined; // the settings the running server was initialized with
  // start/stop/restart and settings changes run one at a time: interleaved, two of them could each
  // see no client and start one, leaving a server nobody stops
  private queue: Promise<void> = Promise.resolve();
  private closed = false;
  private settings = currentSettings();
  private last: ServerStatus | undefined;
  // the draftline/status request in flight and the client it went to: one at a time per client, so a server slow
  // to answer (loading a model, a busy machine) gets no pile of them, one per tick and per focus change
  private polling: { client: LanguageClient; done: Promise<void> } | undefined;
  private timer: NodeJS.Timeout | undefined;
  private readonly output = vscode.window.createOutputChannel('draftline', { log: true });
  private readonly traceOutput = new TraceChannel(this.output, this.settings['trace.server'] !== 'off');
  private readonly item = vscode.window.createStatusBarItem('draftline.status', vscode.StatusBarAlignment.Right, 100);

  constructor(private readonly context: vscode.ExtensionContext) {
    this.item.name = 'draftline';
    this.item.command = 'draftline.showStatus';
    this.render();
    this.item.show();
    context.subscriptions.push(
      this,
      this.output,
      this.traceOutput,
      this.item,
      vscode.commands.registerCommand('draftline.toggle', () => this.toggle()),
      vscode.commands.registerCommand('draftline.showStatus', () => this.showStatus()),
      vscode.commands.registerCommand('draftline.restart', () => this.restart()),
      vscode.workspace.onDidChangeConfiguration((e) => e.affectsConfiguration(SECTION) && void this.configurationChanged()),
      vscode.window.onDidChangeWindowState((state) => state.focused && void this.poll()), // no polling while unfocused
    );
    this.schedulePoll();
  }

  /** Run `task` after every task queued before it (whether they succeeded or not). */
  private serialized(task: () => Promise<void>): Promise<void> {
    const run = this.queue.then(task);
    this.queue = run.catch(() => undefined);
    return run;
  }

  /** Activation: starts the server, unless inline completions are off (then it starts when they are turned on). */
  start(): Promise<void> {
    return this.serialized(async () => {
      if (this.settings.enable) await this.startNow();
      else this.render();
    });
  }

  /** Stops the server for good (deactivate): a settings change queued after it starts none. */
  shutdown(): Promise<void> {
    this.closed = true;
    return this.serialized(() => this.stopNow());
  }

  restart(): Promise<void> {
    return this.serialized(async () => {
      await this.stopNow();
      this.settings = currentSettings();
      await this.startNow();
    });
  }

  /**
   * Starts a client and waits for its start, not for a status poll: the queue waits on this, and a server that
   * never answers draftline/status must not hold up Restart Server, a settings change or deactivate behind it.
   */
  private startNow(): Promise<void> {
    if (this.closed) return Promise.resolve();
    const launched = this.settings;
    const launch = serverLaunch(launched, process.env, launchPlace());
    const serverOptions: ServerOptions = {
      command: launch.command,
      args: launch.args,
      options: { env: launch.env },
    };
    const clientOptions: LanguageClientOptions = {
      documentSelector: clientConfig(launched).documentSelector,
      // A function: vscode-languageclient calls it on every initialize, including its own restart of a
      // crashed server, which would otherwise get the settings of this start. The process and document
      // set stay those of this start, so `started` keeps them and a change of them still restarts.
      initializationOptions: () => {
        const now = this.settings;
        this.started = { ...now, ...subset(launched, LAUNCH_KEYS) };
        return clientConfig(this.started).initializationOptions;
      },
      outputChannel: this.output,
      traceOutputChannel: this.traceOutput,
      middleware: {
        provideInlineCompletionItems: (document, position, context, token, next) =>
          enabledFor(this.settings, document.languageId) ? next(document, position, context, token) : null,
      },
    };
    const client = (this.client = new LanguageClient(SECTION, 'draftline', serverOptions, clientOptions));
    const start = client.start();
    this.render(); // starting
    this.starting = start.then(
      () => {
        this.render();
        void this.poll();
      },
      (err: unknown) => {
        const message = `draftline: could not start \`${launch.command}\`: ${err}`;
        void vscode.window.showErrorMessage(message, 'Open Settings').then((pick) => {
          if (pick) void vscode.commands.executeCommand('workbench.action.openSettings', SECTION);
        });
        this.render();
      },
    );
    return this.starting;
  }

  private async stopNow(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.started = undefined;
    this.last = undefined;
    await this.starting.catch(() => undefined);
    if (client && client.state !== State.Stopped) await client.stop().catch(() => undefined);
    this.render();
  }

  private configurationChanged(): Promise<void> {
    this.settings = currentSettings(); // at once: the middleware's enable/languages check reads it
    this.traceOutput.setTraced(this.settings['trace.server'] !== 'off');
    this.schedulePoll();
    this.render();
    return this.serialized(async () => {
      if (this.closed) return;
      const now = this.settings;
      // off and no server running (none was started, or it failed): none is started until they are turned on
      if (!now.enable && !this.running()) {
        await this.stopNow();
        return;
      }
      // no running server (not started, failed to start, or given up on by vscode-languageclient after crashes),
      // or one that cannot take this change: start one with these settings
      if (!this.client || !this.started || this.client.state === State.Stopped || needsRestart(this.started, now)) {
        await this.stopNow();
        await this.startNow();
        return;
      }
      await this.starting;
      if (this.client?.state === State.Running) {
        await this.client.sendNotification(DidChangeConfigurationNotification.type, didChangeConfigurationParams(now));
      }
      void this.poll(true);
    });
  }

  private async toggle(): Promise<void> {
    const config = vscode.workspace.getConfiguration(SECTION);
    const inspect = config.inspect<boolean>('enable');
    const target =
      inspect?.workspaceFolderValue !== undefined
        ? vscode.ConfigurationTarget.WorkspaceFolder
        : inspect?.workspaceValue !== undefined
          ? vscode.ConfigurationTarget.Workspace
          : vscode.ConfigurationTarget.Global;
    await config.update('enable', !this.settings.enable, target);
  }

  private async showStatus(): Promise<void> {
    // a fresh status if the server answers soon; a server that does not still gets its menu (Restart)
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.poll(), new Promise<void>((resolve) => (timer = setTimeout(resolve, SHOW_STATUS_WAIT_MS)))]);
    clearTimeout(timer);
    const view = statusView(this.last, this.settings.enable, this.running());
    const actions = [this.settings.enable ? 'Turn Off' : 'Turn On', 'Restart', 'Details'];
    const pick = await vscode.window.showInformationMessage(view.tooltip.split('\n').slice(0, 3).join(' | '), ...actions);
    if (pick === 'Restart') await this.restart();
    else if (pick === 'Details') {
      this.output.info(`${STATUS_METHOD}: ${JSON.stringify(this.last ?? null, null, 2)}`);
      this.output.show(true);
    } else if (pick) await this.toggle();
  }

  private running(): boolean {
    return this.client?.state === State.Running;
  }

  /**
   * Ask the running server for draftline/status and render it; joins the request already in flight to that server,
   * or, `fresh` (after a settings change), asks again once it is answered: its answer predates the change.
   */
  private poll(fresh = false): Promise<void> {
    const client = this.client;
    if (!client || client.state !== State.Running) {
      this.render();
      return Promise.resolve();
    }
    if (this.polling?.client === client) {
      return fresh ? this.polling.done.then(() => this.poll()) : this.polling.done;
    }
    const done = (async () => {
      let status: ServerStatus | undefined;
      try {
        status = await client.sendRequest<ServerStatus>(STATUS_METHOD, STATUS_PARAMS);
      } catch {
        status = undefined;
      }
      if (this.polling?.client === client) this.polling = undefined;
      if (this.client !== client) return; // restarted meanwhile: the old server's answer says nothing of the new one
      this.last = status;
      this.render();
    })();
    this.polling = { client, done };
    return done;
  }

  private schedulePoll(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = setInterval(() => vscode.window.state.focused && void this.poll(), this.settings['status.pollMs']);
  }

  private render(): void {
    const view = statusView(this.last, this.settings.enable, this.running(), this.client?.state === State.Starting);
    this.item.text = view.text;
    this.item.tooltip = view.tooltip;
    this.item.backgroundColor = view.warning ? new vscode.ThemeColor('statusBarItem.warningBackground') : undefined;
  }

  dispose(): void {
    if (this.timer) clearInterval(this.timer);
  }
}

let app: Draftline | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  app = new Draftline(context);
  await app.start();
}

export async function deactivate(): Promise<void> {
  await app?.shutdown();
  app = undefined;
}
