;;; draftline.el --- draftline AI completion for eglot and lsp-mode  -*- lexical-binding: t; -*-
;;; Commentary:
;; eglot: completion at point (eglot has no inline completion).  lsp-mode: a client using
;; `lsp-inline-completion' (UNTESTED: no lsp-mode with inline completion is installable here).
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

(provide 'draftline)
;;; draftline.el ends here
