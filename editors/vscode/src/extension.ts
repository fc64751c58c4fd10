/**
 * The VS Code side of draftline: starts `draftline serve`, keeps its settings in sync, shows its
 * status, and offers toggle / status / restart. Inline completion itself is vscode-languageclient's.
 */
import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
} from 'vscode-languageclient/node';
import {
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

/** The settings a running server process keeps until it is restarted (its command line, env and documents). */
const LAUNCH_KEYS = ['server.command', 'server.args', 'server.env', 'languages'] as const;

function subset<T extends object, K extends keyof T>(from: T, keys: readonly K[]): Pick<T, K> {
  return Object.fromEntries(keys.map((k) => [k, from[k]])) as Pick<T, K>;
}

function currentSettings(): Settings {
  const config = vscode.workspace.getConfiguration(SECTION);
  return readSettings((key) => config.get(key));
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
  private timer: NodeJS.Timeout | undefined;
  private readonly output = vscode.window.createOutputChannel('draftline', { log: true });
  private readonly item = vscode.window.createStatusBarItem('draftline.status', vscode.StatusBarAlignment.Right, 100);

  constructor(private readonly context: vscode.ExtensionContext) {
    this.item.name = 'draftline';
    this.item.command = 'draftline.showStatus';
    this.item.show();
    context.subscriptions.push(
      this,
      this.output,
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

  start(): Promise<void> {
    return this.serialized(() => this.startNow());
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

  private startNow(): Promise<void> {
    if (this.closed) return Promise.resolve();
    const launched = this.settings;
    const launch = serverLaunch(launched, process.env);
    const serverOptions: ServerOptions = { command: launch.command, args: launch.args, options: { env: launch.env } };
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
      middleware: {
        provideInlineCompletionItems: (document, position, context, token, next) =>
          enabledFor(this.settings, document.languageId) ? next(document, position, context, token) : null,
      },
    };
    const client = (this.client = new LanguageClient(SECTION, 'draftline', serverOptions, clientOptions));
    this.starting = client.start().then(
      () => this.poll(),
      (err: unknown) => {
        const message = `draftline: could not start \`${launched['server.command']}\`: ${err}`;
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
  }

  private configurationChanged(): Promise<void> {
    this.settings = currentSettings(); // at once: the middleware's enable/languages check reads it
    this.schedulePoll();
    return this.serialized(async () => {
      if (this.closed) return;
      const now = this.settings;
      if (!this.client || !this.started || needsRestart(this.started, now)) {
        await this.stopNow();
        await this.startNow();
        return;
      }
      await this.starting;
      if (this.client?.state === State.Running) {
        await this.client.sendNotification(DidChangeConfigurationNotification.type, didChangeConfigurationParams(now));
      }
      await this.poll();
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
    await this.poll();
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

  private async poll(): Promise<void> {
    const client = this.client;
    if (client && client.state === State.Running) {
      try {
        this.last = await client.sendRequest<ServerStatus>(STATUS_METHOD, STATUS_PARAMS);
      } catch {
        this.last = undefined;
      }
    }
    this.render();
  }

  private schedulePoll(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = setInterval(() => vscode.window.state.focused && void this.poll(), this.settings['status.pollMs']);
  }

  private render(): void {
    const view = statusView(this.last, this.settings.enable, this.running());
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
