;;; draftline.el --- draftline AI completion for eglot and lsp-mode  -*- lexical-binding: t; -*-
;;; Commentary:
;; eglot: ghost text (`draftline-inline-mode': textDocument/inlineCompletion shown as an overlay
;; after point once typing pauses, TAB accepts, any other command dismisses), and completion at
;; point.  lsp-mode: a client using `lsp-inline-completion' (UNTESTED: no lsp-mode with inline
;; completion is installable here).
;;; Code:
(defgroup draftline nil "draftline AI code completion." :group 'tools)
(defcustom draftline-command '("draftline" "serve") "Command that starts the server." :type '(repeat string))
(defcustom draftline-settings nil
  "Settings plist sent as initializationOptions under :draftline, e.g. (:model (:target \"fake\"))."
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
(defface draftline-ghost '((t :inherit shadow)) "Face of draftline's ghost text.")
(defvar-local draftline--overlay nil "The overlay showing the current suggestion.")
(defvar-local draftline--item nil "The inline completion item the overlay shows.")
(defvar-local draftline--timer nil)

(defun draftline-clear ()
  "Remove the ghost text."
  (when draftline--overlay (delete-overlay draftline--overlay))
  (setq draftline--overlay nil draftline--item nil))

(defun draftline--item-text (item)
  (let ((text (plist-get item :insertText)))
    (if (stringp text) text (plist-get text :value))))

(defun draftline--show (items tick pos)
  "Show the first of ITEMS if the buffer is still at TICK with point at POS."
  (when (and (= tick (buffer-chars-modified-tick)) (= pos (point)) (> (length items) 0))
    (let* ((item (aref items 0))
           (range (plist-get item :range))
           (start (if range (car (eglot--range-region range)) (point)))
           (typed (buffer-substring-no-properties start (point)))
           (text (draftline--item-text item)))
      (when (and (stringp text) (string-prefix-p typed text) (> (length text) (length typed)))
        (draftline-clear)
        (setq draftline--item item
              draftline--overlay (make-overlay (point) (point) nil nil t))
        (overlay-put draftline--overlay 'after-string
                     (let ((ghost (propertize (substring text (length typed)) 'face 'draftline-ghost)))
                       (put-text-property 0 1 'cursor t ghost) ghost))
        (let ((server (eglot-current-server)))  ; client-side telemetry: it was shown
          (when server (jsonrpc-notify server :textDocument/didShowCompletion (list :item item))))))))

(defun draftline-inline-request ()
  "Ask the server for ghost text at point (what the idle timer does).
Called as a command it is an invoked request (trigger kind 1): the server answers
even inside a word, where it holds back its automatic (kind 2) suggestions."
  (interactive)
  (let ((server (eglot-current-server))
        (kind (if (called-interactively-p 'any) 1 2)))
    (when server
      (eglot--signal-textDocument/didChange)  ; the server must see what was just typed
      (let ((buf (current-buffer)) (tick (buffer-chars-modified-tick)) (pos (point)))
        (jsonrpc-async-request
         server :textDocument/inlineCompletion
         (append (eglot--TextDocumentPositionParams) (list :context (list :triggerKind kind)))
         :success-fn (lambda (result)
                       (when (buffer-live-p buf)
                         (with-current-buffer buf
                           (draftline--show (or (plist-get result :items) []) tick pos))))
         :error-fn #'ignore :timeout-fn #'ignore)))))

(defun draftline-accept ()
  "Insert the ghost text (replacing what its range covers) and tell the server it was accepted."
  (interactive)
  (let ((item draftline--item))
    (when item
      (draftline-clear)
      (let* ((range (plist-get item :range))
             (region (if range (eglot--range-region range) (cons (point) (point)))))
        (delete-region (car region) (max (point) (cdr region)))
        (goto-char (car region))
        (insert (draftline--item-text item)))
      (let ((command (plist-get item :command)) (server (eglot-current-server)))
        (when (and command server)
          (eglot-execute-command server (plist-get command :command) (plist-get command :arguments)))))))

(defun draftline--post-command ()
  (unless (eq this-command 'draftline-accept)
    (draftline-clear)
    (when draftline--timer (cancel-timer draftline--timer))
    (when (memq this-command '(self-insert-command newline delete-backward-char))
      (setq draftline--timer (run-with-idle-timer draftline-inline-idle nil #'draftline--timer-fired
                                                  (current-buffer))))))

(defun draftline--timer-fired (buf)
  (when (and (buffer-live-p buf) (eq buf (current-buffer)))
    (draftline-inline-request)))

(defvar draftline-inline-mode-map
  (let ((map (make-sparse-keymap)))
    ;; TAB accepts only while ghost text is shown; otherwise TAB does what it always did
    (define-key map (kbd "TAB") '(menu-item "" draftline-accept :filter (lambda (cmd) (and draftline--overlay cmd))))
    (define-key map (kbd "<tab>") '(menu-item "" draftline-accept :filter (lambda (cmd) (and draftline--overlay cmd))))
    map))

(define-minor-mode draftline-inline-mode
  "Ghost text from draftline (textDocument/inlineCompletion) in an eglot buffer."
  :lighter " dl" :keymap draftline-inline-mode-map
  (if draftline-inline-mode
      (add-hook 'post-command-hook #'draftline--post-command nil t)
    (remove-hook 'post-command-hook #'draftline--post-command t)
    (draftline-clear)))

(with-eval-after-load 'eglot
  (add-hook 'eglot-managed-mode-hook
            (lambda () (when (and (eglot-current-server) (cl-typep (eglot-current-server) 'draftline-eglot-server))
                         (draftline-inline-mode (if (eglot-managed-p) 1 -1))))))

(provide 'draftline)
;;; draftline.el ends here
