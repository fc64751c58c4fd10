;;; draftline.el --- draftline AI completion for eglot and lsp-mode  -*- lexical-binding: t; -*-
;;; Commentary:
;; eglot: ghost text (`draftline-inline-mode': textDocument/inlineCompletion shown as an overlay
;; after point once typing pauses, TAB accepts, typing what it shows keeps the rest, any other
;; command dismisses), and completion at point.  lsp-mode: a client using `lsp-inline-completion'
;; (UNTESTED: no lsp-mode with inline completion is installable here).
;;; Code:
(require 'cl-lib)
;; `defclass' below runs once eglot is loaded, but it must be compiled as the macro it is, also
;; where eglot is absent at compile time (package.el, make)
(require 'eieio)

(defvar eglot-server-programs)
(defvar draftline-inline-mode)
(declare-function draftline-eglot-server--eieio-childp "draftline")  ; defined by the `defclass'
(declare-function eglot-current-server "eglot")
(declare-function eglot-managed-p "eglot")
(declare-function eglot--range-region "eglot")
(declare-function eglot--TextDocumentPositionParams "eglot")
(declare-function eglot--signal-textDocument/didChange "eglot")
(declare-function jsonrpc-async-request "jsonrpc")
(declare-function jsonrpc-notify "jsonrpc")
(declare-function jsonrpc-running-p "jsonrpc")
(declare-function object-of-class-p "eieio")
(declare-function lsp-register-client "lsp-mode")
(declare-function make-lsp-client "lsp-mode")
(declare-function lsp-stdio-connection "lsp-mode")
(declare-function lsp-inline-completion-mode "lsp-inline-completion")

(defgroup draftline nil "draftline AI code completion." :group 'tools)
(defcustom draftline-command '("draftline" "serve") "Command that starts the server." :type '(repeat string))
(defcustom draftline-settings nil
  "Settings plist sent as initializationOptions under :draftline.
For example (:model (:target \"fake\"))."
  :type 'sexp)
(defcustom draftline-modes '(python-mode python-ts-mode) "Major modes draftline serves." :type '(repeat symbol))

(defun draftline--init-options (&rest _) (list :draftline draftline-settings))

(with-eval-after-load 'eglot
  (defclass draftline-eglot-server (eglot-lsp-server) () :documentation "draftline server.")
  (cl-defmethod eglot-initialization-options ((_s draftline-eglot-server)) (draftline--init-options))
  (add-to-list 'eglot-server-programs
               (cons draftline-modes (append (list 'draftline-eglot-server) draftline-command))))

(with-eval-after-load 'lsp-mode
  (lsp-register-client
   (make-lsp-client :new-connection (lsp-stdio-connection (lambda () draftline-command))
                    :major-modes draftline-modes :server-id 'draftline :add-on? t
                    :initialization-options #'draftline--init-options))
  (when (require 'lsp-inline-completion nil t)
    (add-hook 'lsp-managed-mode-hook #'lsp-inline-completion-mode)))


;;; Ghost text over eglot: textDocument/inlineCompletion as an overlay after point.
(defcustom draftline-inline-idle 0.1 "Seconds of idle typing before asking for ghost text." :type 'number)
(defcustom draftline-inline-ignore-commands '(undo undo-only undo-redo undo-tree-undo undo-tree-redo)
  "Commands whose edits do not ask for ghost text.
Any other command that edits the buffer does, once typing pauses."
  :type '(repeat symbol))
(defface draftline-ghost '((t :inherit shadow)) "Face of draftline's ghost text.")
(defvar-local draftline--overlay nil "The overlay showing the current suggestion.")
(defvar-local draftline--item nil "The inline completion item the overlay shows.")
(defvar-local draftline--region nil "Markers (START . END): what accepting the item replaces.")
(defvar-local draftline--tick nil "`buffer-chars-modified-tick' the shown ghost text belongs to.")
(defvar-local draftline--changes nil "Changes (BEG END LEN) made by the command running now.")
(defvar-local draftline--ghost-before nil "Whether ghost text was shown at point when this command began.")
(defvar-local draftline--timer nil)

(defun draftline--server ()
  "The running draftline server of this buffer, or nil."
  (let ((server (and (eglot-managed-p) (eglot-current-server))))
    (and server (object-of-class-p server 'draftline-eglot-server) (jsonrpc-running-p server) server)))

(defun draftline-clear ()
  "Remove the ghost text."
  (when draftline--overlay (delete-overlay draftline--overlay))
  (when draftline--region (set-marker (car draftline--region) nil) (set-marker (cdr draftline--region) nil))
  (setq draftline--overlay nil draftline--item nil draftline--region nil draftline--tick nil))

(defun draftline--ghost-p ()
  "Non-nil while ghost text is shown at point for the buffer's current text."
  (and draftline--overlay (overlay-buffer draftline--overlay)
       (eql draftline--tick (buffer-chars-modified-tick))
       (= (point) (overlay-start draftline--overlay))))

(defun draftline--item-text (item)
  (let ((text (plist-get item :insertText)))
    (if (stringp text) text (plist-get text :value))))

(defun draftline--ghost-string (text)
  (let ((ghost (propertize text 'face 'draftline-ghost)))
    (put-text-property 0 1 'cursor t ghost)
    ghost))

(defun draftline--show (items tick pos)
  "Show the first of ITEMS if the buffer is still at TICK with point at POS."
  (when (and draftline-inline-mode (= tick (buffer-chars-modified-tick)) (= pos (point)) (> (length items) 0)
             (eq (window-buffer) (current-buffer)))
    (let* ((item (aref items 0))
           (range (plist-get item :range))
           (region (if range (eglot--range-region range t) (cons (copy-marker pos) (copy-marker pos))))
           (start (car region))
           (text (draftline--item-text item)))
      (if (not (and (stringp text) (<= (point-min) start pos) (<= pos (cdr region))
                    (string-prefix-p (buffer-substring-no-properties start pos) text)
                    (> (length text) (- pos start))))
          (progn (set-marker (car region) nil) (set-marker (cdr region) nil))
        (draftline-clear)
        (setq draftline--item item draftline--region region draftline--tick tick
              draftline--overlay (make-overlay pos pos nil nil t))
        (overlay-put draftline--overlay 'window (selected-window))  ; not in other windows on this buffer
        (overlay-put draftline--overlay 'after-string (draftline--ghost-string (substring text (- pos start))))
        (let ((server (draftline--server)))  ; client-side telemetry: it was shown
          (when server (jsonrpc-notify server :textDocument/didShowCompletion (list :item item))))))))

(defun draftline-inline-request ()
  "Ask the server for ghost text at point (what the idle timer does).
Called as a command it is an invoked request (trigger kind 1): the server
answers even inside a word, where it holds back automatic (kind 2) ones."
  (interactive)
  (let ((server (draftline--server))
        (kind (if (called-interactively-p 'any) 1 2)))
    (cond
     (server
      (eglot--signal-textDocument/didChange)  ; the server must see what was just typed
      (let ((buf (current-buffer)) (tick (buffer-chars-modified-tick)) (pos (point)))
        (jsonrpc-async-request
         server :textDocument/inlineCompletion
         (append (eglot--TextDocumentPositionParams) (list :context (list :triggerKind kind)))
         :success-fn (lambda (result)
                       (when (buffer-live-p buf)
                         (with-current-buffer buf
                           (draftline--show (or (plist-get result :items) []) tick pos))))
         :error-fn #'ignore :timeout-fn #'ignore)))
     ((= kind 1) (message "draftline: no running draftline server here (M-x eglot starts one)")))))

(defun draftline-accept ()
  "Insert the ghost text and tell the server it was accepted.
The text replaces what the item's range covers (and what was typed over it)."
  (interactive)
  (if (not (draftline--ghost-p))
      (draftline-clear)
    (let* ((item draftline--item)
           (start (marker-position (car draftline--region)))
           (end (max (point) (cdr draftline--region))))
      (draftline-clear)
      (delete-region start end)
      (goto-char start)
      (insert (draftline--item-text item))
      (let ((command (plist-get item :command)) (server (draftline--server)))
        (when (and command server)  ; asynchronous: TAB never waits on the server
          (jsonrpc-async-request server :workspace/executeCommand
                                 (list :command (plist-get command :command)
                                       :arguments (plist-get command :arguments))
                                 :success-fn #'ignore :error-fn #'ignore :timeout-fn #'ignore))))))

(defun draftline--window-change (window)
  "Remove the ghost text of WINDOW's buffer once WINDOW is not selected."
  (with-current-buffer (window-buffer window)
    (when (and draftline--overlay (not (eq (overlay-get draftline--overlay 'window) (selected-window))))
      (draftline-clear))))

(defun draftline--pre-command () (setq draftline--changes nil draftline--ghost-before (draftline--ghost-p)))

(defun draftline--after-change (beg end len) (push (list beg end len) draftline--changes))

(defun draftline--type-through (changes)
  "Keep the ghost text if CHANGES only typed its next characters; non-nil if kept."
  ;; the overlay may be gone though it was shown when the command began (a minibuffer opened meanwhile)
  (when (and changes draftline--ghost-before draftline--overlay (overlay-buffer draftline--overlay))
    (let* ((from (overlay-start draftline--overlay))
           (ghost (substring-no-properties (overlay-get draftline--overlay 'after-string)))
           (typed (- (point) from)))
      (when (and (cl-every (lambda (c) (and (= (nth 2 c) 0) (<= from (nth 0 c)) (<= (nth 1 c) (point)))) changes)
                 (= typed (apply #'+ (mapcar (lambda (c) (- (nth 1 c) (nth 0 c))) changes)))
                 (< 0 typed (length ghost))
                 (string= (buffer-substring-no-properties from (point)) (substring ghost 0 typed)))
        (move-overlay draftline--overlay (point) (point))
        (overlay-put draftline--overlay 'after-string (draftline--ghost-string (substring ghost typed)))
        (setq draftline--tick (buffer-chars-modified-tick))))))

(defun draftline--post-command ()
  (let ((changes draftline--changes))
    (setq draftline--changes nil)
    (unless (eq this-command 'draftline-accept)
      (when draftline--timer (cancel-timer draftline--timer) (setq draftline--timer nil))
      (unless (draftline--type-through changes)
        (draftline-clear)
        (when (and changes (not (memq this-command draftline-inline-ignore-commands)))
          (setq draftline--timer (run-with-idle-timer draftline-inline-idle nil #'draftline--timer-fired
                                                      (current-buffer))))))))

(defun draftline--timer-fired (buf)
  (when (and (buffer-live-p buf) (eq buf (current-buffer)))
    (setq draftline--timer nil)
    (when draftline-inline-mode (draftline-inline-request))))

(defvar draftline-inline-mode-map
  (let ((map (make-sparse-keymap)))
    ;; TAB accepts only while ghost text is shown; otherwise TAB does what it always did
    (define-key map (kbd "TAB") '(menu-item "" draftline-accept :filter (lambda (cmd) (and (draftline--ghost-p) cmd))))
    (define-key map (kbd "<tab>") '(menu-item "" draftline-accept :filter (lambda (cmd) (and (draftline--ghost-p) cmd))))
    map))

(define-minor-mode draftline-inline-mode
  "Ghost text from draftline (textDocument/inlineCompletion) in an eglot buffer."
  :lighter " dl" :keymap draftline-inline-mode-map
  (when draftline--timer (cancel-timer draftline--timer) (setq draftline--timer nil))
  (draftline-clear)
  (setq draftline--changes nil)
  (if draftline-inline-mode
      (progn (add-hook 'pre-command-hook #'draftline--pre-command nil t)
             (add-hook 'after-change-functions #'draftline--after-change nil t)
             (add-hook 'post-command-hook #'draftline--post-command nil t)
             (add-hook 'window-selection-change-functions #'draftline--window-change nil t))
    (remove-hook 'pre-command-hook #'draftline--pre-command t)
    (remove-hook 'after-change-functions #'draftline--after-change t)
    (remove-hook 'post-command-hook #'draftline--post-command t)
    (remove-hook 'window-selection-change-functions #'draftline--window-change t)))

(defun draftline--managed-mode-hook ()
  "Turn `draftline-inline-mode' on in buffers a draftline server manages."
  ;; only while managed: `eglot-current-server' caches what it finds, and in a buffer eglot is
  ;; leaving (its server died) that would be the dead server, which a reconnect would then reuse
  (if (and (eglot-managed-p) (object-of-class-p (eglot-current-server) 'draftline-eglot-server))
      (draftline-inline-mode 1)
    (when draftline-inline-mode (draftline-inline-mode -1))))

(with-eval-after-load 'eglot
  (add-hook 'eglot-managed-mode-hook #'draftline--managed-mode-hook))

(provide 'draftline)
;;; draftline.el ends here
