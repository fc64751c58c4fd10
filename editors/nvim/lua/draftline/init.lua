-- draftline for Neovim >= 0.11: vim.lsp.config/enable; inline completion on >= 0.12, completion on 0.11.
local M = {}

M.defaults = {
  cmd = { "draftline", "serve" },
  filetypes = { "python", "lua", "javascript", "typescript", "go", "rust", "c", "cpp", "java", "sh" },
  root_markers = { ".draftline.toml", ".git" },
  settings = {}, -- sent as initializationOptions and workspace/didChangeConfiguration ({draftline = ...})
  keys = { accept = "<Tab>", next = "<M-]>", prev = "<M-[>", dismiss = "<C-]>" },
  completion_fallback = true, -- 0.11: vim.lsp.completion.enable(autotrigger) on attach
}

local function has_inline() return vim.lsp.inline_completion ~= nil end

function M.status(bufnr)
  local c = vim.lsp.get_clients({ name = "draftline", bufnr = bufnr })[1]
  if not c then return nil end
  local r = c:request_sync("draftline/status", vim.NIL, 3000, bufnr or 0)
  return r and r.result
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
      elseif opts.completion_fallback and vim.lsp.completion then
        vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = true })
      end
    end,
  })
  vim.lsp.enable("draftline")
  if has_inline() then
    local k = opts.keys
    if k.accept then
      vim.keymap.set("i", k.accept, function()
        if not vim.lsp.inline_completion.get() then return k.accept end
      end, { expr = true, replace_keycodes = true, desc = "draftline: accept" })
    end
    if k.next then vim.keymap.set("i", k.next, function() vim.lsp.inline_completion.select({ count = 1 }) end, { desc = "draftline: next" }) end
    if k.prev then vim.keymap.set("i", k.prev, function() vim.lsp.inline_completion.select({ count = -1 }) end, { desc = "draftline: previous" }) end
    if k.dismiss then
      vim.keymap.set("i", k.dismiss, function()
        vim.lsp.inline_completion.enable(false, { bufnr = 0 })
        vim.lsp.inline_completion.enable(true, { bufnr = 0 })
      end, { desc = "draftline: dismiss" })
    end
  end
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
