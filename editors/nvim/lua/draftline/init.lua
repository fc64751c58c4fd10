-- draftline for Neovim >= 0.11: vim.lsp.config/enable; inline completion on >= 0.12, completion on 0.11.
local M = {}

M.defaults = {
  cmd = { "draftline", "serve" },
  filetypes = { "python", "lua", "javascript", "typescript", "go", "rust", "c", "cpp", "java", "sh" },
  root_markers = { ".draftline.toml", ".git" },
  settings = {}, -- sent as initializationOptions and workspace/didChangeConfiguration ({draftline = ...})
  keys = { accept = "<Tab>", next = "<M-]>", prev = "<M-[>", dismiss = "<C-]>" },
  completion_fallback = true, -- 0.11: vim.lsp.completion.enable(autotrigger) on attach
  -- 0.11 autotrigger asks only on the server's triggerCharacters, and draftline advertises none
  -- (ghost text wants every keystroke): these are added client-side
  fallback_triggers = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.([{,:= ",
}

local function has_inline() return vim.lsp.inline_completion ~= nil end

function M.status(bufnr)
  local c = vim.lsp.get_clients({ name = "draftline", bufnr = bufnr })[1]
  if not c then return nil end
  local r = c:request_sync("draftline/status", vim.NIL, 3000, bufnr or 0)
  return r and r.result
end

-- Buffer-local: only draftline's buffers lose <Tab> etc. to it.
function M.set_keys(bufnr, k)
  local function map(lhs, rhs, desc, expr)
    if lhs then vim.keymap.set("i", lhs, rhs, { buffer = bufnr, expr = expr, replace_keycodes = expr or nil, desc = desc }) end
  end
  map(k.accept, function()
    if not vim.lsp.inline_completion.get() then return k.accept end
  end, "draftline: accept", true)
  map(k.next, function() vim.lsp.inline_completion.select({ count = 1 }) end, "draftline: next")
  map(k.prev, function() vim.lsp.inline_completion.select({ count = -1 }) end, "draftline: previous")
  map(k.dismiss, function()
    vim.lsp.inline_completion.enable(false, { bufnr = bufnr })
    vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
  end, "draftline: dismiss")
end

-- 0.11 inserts only the first word of an item's textEdit ("return" of "return a + b"): a draftline
-- item inserts its whole first line (other servers' items are left alone)
local function fallback_convert(item)
  if item.detail ~= "draftline" or not item.textEdit then return {} end
  return { word = item.textEdit.newText:match("^[^\n]*") }
end

-- 0.11: draftline's item in the popup menu while typing.
function M.enable_fallback(client, bufnr, opts)
  local provider = client.server_capabilities.completionProvider
  if type(provider) ~= "table" then return end
  -- enable() reads the trigger characters once per client and buffer, so they go in first
  local chars, seen = type(provider.triggerCharacters) == "table" and provider.triggerCharacters or {}, {}
  for _, c in ipairs(chars) do seen[c] = true end
  for c in (opts.fallback_triggers or ""):gmatch(".") do
    if not seen[c] then table.insert(chars, c); seen[c] = true end
  end
  provider.triggerCharacters = chars
  -- the menu shows one item only with menuone; without noselect that item is inserted as soon as it
  -- arrives, in the middle of typing, and <CR> would take it. 'completeopt' is global-local: a buffer
  -- without a local value reads "" with { buf = }, so start from the global value (the user's flags,
  -- e.g. noinsert, popup, fuzzy) unless the buffer already has its own.
  local cot = vim.api.nvim_get_option_value("completeopt", { buf = bufnr })
  if cot == "" then cot = vim.go.completeopt end
  cot = vim.split(cot, ",", { trimempty = true })
  for _, flag in ipairs({ "menuone", "noselect" }) do
    if not vim.tbl_contains(cot, flag) then table.insert(cot, flag) end
  end
  vim.api.nvim_set_option_value("completeopt", table.concat(cot, ","), { buf = bufnr })
  vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = true, convert = fallback_convert })
end

function M.setup(opts)
  opts = vim.tbl_deep_extend("force", M.defaults, opts or {})
  M.opts = opts
  local settings = { draftline = opts.settings }
  vim.lsp.config("draftline", {
    cmd = opts.cmd,
    filetypes = opts.filetypes,
    root_markers = opts.root_markers,
    init_options = settings,
    settings = settings,
    on_attach = function(client, bufnr)
      if has_inline() then
        vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
        M.set_keys(bufnr, opts.keys)
      elseif opts.completion_fallback and vim.lsp.completion then
        M.enable_fallback(client, bufnr, opts)
      end
    end,
  })
  vim.lsp.enable("draftline")
  vim.api.nvim_create_user_command("DraftlineStatus", function()
    print(vim.inspect(M.status(0)))
  end, {})
  vim.api.nvim_create_user_command("DraftlineToggle", function()
    if has_inline() then
      local on = vim.lsp.inline_completion.is_enabled({ bufnr = 0 })
      vim.lsp.inline_completion.enable(not on, { bufnr = 0 })
    end
  end, {})
end

return M
