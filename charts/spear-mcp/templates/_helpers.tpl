{{/*
Names. Most are fixed: the operator and the agents refer to them by name (src/operator/rbac.rs,
the operator's flags), so the chart is installed once per cluster.
*/}}
{{- define "spear-mcp.name" -}}spear-mcp{{- end -}}
{{- define "spear-mcp.operatorName" -}}spear-operator{{- end -}}
{{- define "spear-mcp.agentRoleName" -}}spear-mcp-agent{{- end -}}
{{- define "spear-mcp.secretReaderName" -}}spear-operator-secret-reader{{- end -}}
{{- define "spear-mcp.webhookConfigName" -}}spear-mcp-injector{{- end -}}
{{- define "spear-mcp.webhookServiceName" -}}spear-operator-webhook{{- end -}}
{{- define "spear-mcp.leaseName" -}}spear-operator{{- end -}}
{{/* The Secret the operator keeps its self-signed CA and certificate in (self-signed mode). */}}
{{- define "spear-mcp.selfSignedSecretName" -}}spear-operator-webhook-tls{{- end -}}
{{/* The Secret cert-manager writes the serving certificate to (cert-manager mode). */}}
{{- define "spear-mcp.certManagerSecretName" -}}spear-operator-webhook-cert{{- end -}}
{{- define "spear-mcp.certificateName" -}}spear-operator-webhook{{- end -}}
{{- define "spear-mcp.issuerName" -}}spear-operator-selfsigned{{- end -}}

{{/* chart label value: name-version, `+` is not allowed in label values. */}}
{{- define "spear-mcp.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object but app.kubernetes.io/managed-by. */}}
{{- define "spear-mcp.labelsWithoutManager" -}}
helm.sh/chart: {{ include "spear-mcp.chart" . }}
app.kubernetes.io/name: {{ include "spear-mcp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: spear-mcp
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "spear-mcp.labels" -}}
{{ include "spear-mcp.labelsWithoutManager" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels of the operator's objects: the common ones plus the component. */}}
{{- define "spear-mcp.operatorLabels" -}}
{{ include "spear-mcp.labels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Selector of the operator pods; never changes across upgrades (selectors are immutable). */}}
{{- define "spear-mcp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spear-mcp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/*
An image reference from {repository, tag, digest} with fallbacks:
  include "spear-mcp.image" (list .Values.operator.image .Chart.AppVersion)
A digest wins over a tag; an empty tag falls back to the second element.
*/}}
{{- define "spear-mcp.image" -}}
{{- $image := index . 0 -}}
{{- $defaultTag := index . 1 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default $defaultTag $image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "spear-mcp.operatorImage" -}}
{{- include "spear-mcp.image" (list .Values.operator.image .Chart.AppVersion) -}}
{{- end -}}

{{- define "spear-mcp.spearletImage" -}}
{{- include "spear-mcp.image" (list .Values.spearlet.image .Chart.AppVersion) -}}
{{- end -}}

{{/* The agent image: its own values where set, else the spearlet image's. */}}
{{- define "spear-mcp.agentImage" -}}
{{- $spearlet := .Values.spearlet.image -}}
{{- $agent := .Values.agent.image -}}
{{- $merged := dict "repository" (default $spearlet.repository $agent.repository) "tag" (default $spearlet.tag $agent.tag) "digest" $agent.digest -}}
{{- if and (not $agent.repository) (not $agent.tag) (not $agent.digest) -}}
{{- $_ := set $merged "digest" $spearlet.digest -}}
{{- end -}}
{{- include "spear-mcp.image" (list $merged .Chart.AppVersion) -}}
{{- end -}}

{{/* The operator's --cert-mode: cert-manager writes files the operator reads. */}}
{{- define "spear-mcp.operatorCertMode" -}}
{{- if eq .Values.webhook.certs.mode "cert-manager" -}}files{{- else -}}self-signed{{- end -}}
{{- end -}}

{{/* Checks that values fit together; renders nothing. */}}
{{- define "spear-mcp.validate" -}}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.operator.leaderElection) -}}
{{- fail "operator.replicas > 1 needs operator.leaderElection=true: only one replica may write status and RoleBindings" -}}
{{- end -}}
{{- with .Values.adminView -}}
{{- if and .enabled .service.enabled (not .service.allowWithoutNetworkPolicy) (not $.Values.webhook.networkPolicy.enabled) -}}
{{- fail "adminView.service.enabled=true needs webhook.networkPolicy.enabled=true (the view has no authentication; the policy opens its port to webhook.networkPolicy.adminViewFrom only), or adminView.service.allowWithoutNetworkPolicy=true when something else guards the port" -}}
{{- end -}}
{{- end -}}
{{- with .Values.webhook.clientAuth -}}
{{- if and .enabled (not (or .caConfigMap .caSecret)) -}}
{{- fail "webhook.clientAuth.enabled=true needs webhook.clientAuth.caConfigMap or webhook.clientAuth.caSecret: the object holding the CA bundle of the API server's webhook client certificate" -}}
{{- end -}}
{{- if and .caConfigMap .caSecret -}}
{{- fail "set one of webhook.clientAuth.caConfigMap and webhook.clientAuth.caSecret, not both" -}}
{{- end -}}
{{- end -}}
{{- end -}}
